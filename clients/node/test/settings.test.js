// Settings that another role can choose for a session (ALTER DATABASE / ALTER ROLE ... SET, PGOPTIONS) never change
// what the client reads back: with bytea_output = 'escape', DateStyle = 'SQL, DMY', IntervalStyle =
// 'sql_standard', TimeZone = 'Asia/Kolkata' and extra_float_digits = 0 on every connection, a replay is the first
// response byte for byte (bytes that are not UTF-8, text, JSON) through every adapter, the reference service and
// lease mode, on pipelined and plain clients, with named and unnamed statements (PgBouncer's fallback). Against a
// real PostgreSQL: IDEM_TEST_DATABASE_URL. Fails on a client that decodes the claim's bytea text as hex only (a
// replay answered with an empty body).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import Koa from 'koa';
import Fastify from 'fastify';
import { fastifyIdempotency, idempotency, jsonResponse, koaIdempotency, runLease } from '../src/index.js';
import { CapturedResponse } from '../src/responses.js';
import { createApp } from '../service/app.js';
import { listen, quietLogger, testPool, unique } from './helpers.js';

const skip = process.env.IDEM_TEST_DATABASE_URL ? false : 'IDEM_TEST_DATABASE_URL is not set';

export const SETTINGS = {
  bytea_output: 'escape', DateStyle: 'SQL, DMY', IntervalStyle: 'sql_standard', TimeZone: 'Asia/Kolkata',
  extra_float_digits: '0',
};
/** The startup option that sets SETTINGS on every connection of a pool (a space in a value escaped). */
const OPTIONS = Object.entries(SETTINGS).map(([k, v]) => `-c ${k}=${v.replace(/ /g, '\\ ')}`).join(' ');

const ALL_BYTES = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
/** The answers of the handlers below, by X-Case: [status, content type, body bytes]. */
const CASES = {
  binary: [201, 'application/octet-stream', Buffer.concat([ALL_BYTES, Buffer.from('\\x00\\\\'), Buffer.from(ALL_BYTES).reverse()])],
  latin1: [200, 'text/html; charset=iso-8859-1', Buffer.from('<p>caf\xe9 \\ na\xefve</p>', 'latin1')],
  text: [202, 'text/plain; charset=utf-8', Buffer.from('naïve \\ "quoted" ✓ (a,b)\n\t\\x41', 'utf8')],
  json: [201, 'application/json', Buffer.from('{"a": "\\\\x41 \\u00e9 ✓", "n": [1.5e300, 0.1, 100.0], "t": "07/12/2026"}')],
  empty: [200, 'text/plain', Buffer.alloc(0)],
};

function answerOf(headers) {
  return CASES[headers['x-case']];
}

/** One app per adapter, each answering CASES by X-Case on POST /p. */
const APPS = {
  express: (options) => {
    const app = express();
    app.post('/p', idempotency(options)((req, res) => {
      const [status, type, body] = answerOf(req.headers);
      res.status(status).set('Content-Type', type).end(body);
    }));
    return listen(app);
  },
  koa: (options) => {
    const app = new Koa();
    app.silent = true;
    app.use(koaIdempotency(options));
    app.use((ctx) => {
      const [status, type, body] = answerOf(ctx.headers);
      ctx.status = status;
      ctx.set('Content-Type', type);
      ctx.body = body;
    });
    return listen(app.callback());
  },
  fastify: async (options) => {
    const app = Fastify();
    await app.register(fastifyIdempotency, options);
    app.post('/p', { config: { idempotency: true } }, async (request, reply) => {
      const [status, type, body] = answerOf(request.headers);
      return reply.code(status).header('Content-Type', type).send(body);
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
  },
};

async function send(url, headers, body = '{"amount_cents": 100, "currency": "EUR"}') {
  const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body });
  return { status: res.status, headers: res.headers, bytes: Buffer.from(await res.arrayBuffer()) };
}

function assertSame(replay, first, what) {
  assert.equal(replay.headers.get('idempotent-replayed'), 'true', `${what}: a replay`);
  assert.equal(replay.status, first.status, `${what}: status`);
  assert.equal(replay.headers.get('content-type'), first.headers.get('content-type'), `${what}: Content-Type`);
  assert.equal(replay.bytes.toString('hex'), first.bytes.toString('hex'), `${what}: the same bytes`);
}

for (const pipeline of [true, false]) {
  for (const prepared of ['auto', false]) {
    describe(`session settings (${pipeline ? 'pipelined' : 'plain'} client, prepared: ${prepared})`, { skip }, () => {
      const run = unique('s');
      let pool;
      before(async () => {
        pool = await testPool({ max: 4, pipeline, options: OPTIONS });
      });
      after(async () => {
        await pool?.end();
      });

      test('the settings are in force on the pool', async () => {
        const { rows: [row] } = await pool.query(
          'SELECT current_setting($1) AS b, current_setting($2) AS d, current_setting($3) AS i, ' +
          'current_setting($4) AS z, current_setting($5) AS f', Object.keys(SETTINGS));
        assert.deepEqual(Object.values(row), Object.values(SETTINGS));
      });

      for (const [name, make] of Object.entries(APPS)) {
        test(`${name}: every body replays byte for byte`, async () => {
          const srv = await make({ pool, prepared, logger: quietLogger, scope: () => run });
          try {
            for (const [what, [status, , body]] of Object.entries(CASES)) {
              const headers = { 'Idempotency-Key': `${name}-${what}`, 'X-Case': what };
              const first = await send(`${srv.url}/p`, headers);
              assert.equal(first.status, status, what);
              assert.equal(first.headers.get('idempotent-replayed'), null, what);
              assert.ok(first.bytes.equals(body), `${what}: the handler's bytes`);
              assertSame(await send(`${srv.url}/p`, headers), first, what);
            }
          } finally {
            await srv.close();
          }
        });
      }

      test('the reference service: POST /payments and POST /rides replay byte for byte', async () => {
        const srv = await listen(createApp({ pool, prepared, logger: quietLogger, ridesLeaseSeconds: 5 }));
        try {
          for (const path of ['/payments', '/rides']) {
            const headers = { Authorization: `Bearer ${run}_svc`, 'Idempotency-Key': `svc${path}` };
            const first = await send(`${srv.url}${path}`, headers);
            assert.equal(first.status, 201, first.bytes.toString());
            assertSame(await send(`${srv.url}${path}`, headers), first, path);
          }
        } finally {
          await srv.close();
        }
      });

      test('runLease: a stored binary response replays byte for byte', async () => {
        const [status, type, body] = CASES.binary;
        const options = {
          scope: run, path: '/lease', body: '{}', leaseSeconds: 5, logger: quietLogger,
          steps: [{ name: 'one', run: async () => {} }],
          finish: async () => new CapturedResponse(status, [['Content-Type', type]], body),
        };
        const first = await runLease(pool, `lease-${prepared}`, options);
        assert.equal(first.header('Idempotent-Replayed'), undefined);
        const replay = await runLease(pool, `lease-${prepared}`, { ...options, finish: async () => jsonResponse(500, {}) });
        assert.equal(replay.header('Idempotent-Replayed'), 'true');
        assert.equal(replay.status, status);
        assert.equal(replay.header('Content-Type'), type);
        assert.equal(replay.body.toString('hex'), body.toString('hex'));
      });
    });
  }
}
