// The Koa middleware and the Fastify plugin against a fake pool: the same flow as Express (BEGIN + claim, the
// handler's statements, complete + COMMIT), and the status committed is the status sent when a handler fails after
// a write: a 4xx error is stored as the framework sent it, a 5xx or an error without a status is rolled back.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Koa from 'koa';
import Fastify from 'fastify';
import { fastifyIdempotency, koaIdempotency } from '../src/index.js';
import { fakePool, listen, post, quietLogger, steps } from './helpers.js';

const KEY = { 'Idempotency-Key': '"k1"' };
const httpError = (status, message) => Object.assign(new Error(message), { status, expose: true });

// Each scenario: the handler (given the db client and a way to answer), then what the client gets and the statements.
const SCENARIOS = [
  {
    name: 'a 201 is stored as the bytes sent',
    run: async (db, answer) => {
      await db.query('INSERT 1');
      return answer(201, { id: 1, ok: true });
    },
    status: 201, text: '{"id":1,"ok":true}', steps: ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT'],
  },
  {
    name: 'a 4xx error thrown after the insert is stored as the framework sent it',
    run: async (db) => {
      await db.query('INSERT 1');
      throw httpError(422, 'card declined');
    },
    status: 422, steps: ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT'],
  },
  {
    name: 'a 5xx error thrown after the insert is rolled back',
    run: async (db) => {
      await db.query('INSERT 1');
      throw httpError(502, 'provider down');
    },
    status: 502, steps: ['BEGIN', 'claim', 'INSERT 1', 'ROLLBACK'],
  },
  {
    name: 'an error without a status after the insert is rolled back (500)',
    run: async (db) => {
      await db.query('INSERT 1');
      throw new Error('a bug');
    },
    status: 500, steps: ['BEGIN', 'claim', 'INSERT 1', 'ROLLBACK'],
  },
  {
    name: 'a 503 answered after the insert is rolled back',
    run: async (db, answer) => {
      await db.query('INSERT 1');
      return answer(503, { error: 'upstream' });
    },
    status: 503, steps: ['BEGIN', 'claim', 'INSERT 1', 'ROLLBACK'],
  },
  {
    name: 'notExecuted(): the 422 is sent, rolled back, not stored',
    run: async (db, answer, idem) => {
      idem.notExecuted();
      return answer(422, { error: 'invalid' });
    },
    status: 422, text: '{"error":"invalid"}', steps: ['BEGIN', 'claim', 'ROLLBACK'],
  },
];

async function koaServer(pool, run) {
  const app = new Koa();
  app.silent = true;
  app.use(koaIdempotency({ pool, logger: quietLogger }));
  app.use(async (ctx) => {
    assert.equal(ctx.idempotency.key, 'k1');
    assert.deepEqual(ctx.request.body, { a: 1 });
    await run(ctx.idempotency.client, (status, body) => {
      ctx.status = status;
      ctx.body = body;
    }, ctx.idempotency);
  });
  return listen(app.callback());
}

async function fastifyServer(pool, run) {
  const app = Fastify();
  await app.register(fastifyIdempotency, { pool, logger: quietLogger });
  app.post('/p', { config: { idempotency: true } }, async (request, reply) => {
    assert.equal(request.idempotency.key, 'k1');
    assert.deepEqual(request.body, { a: 1 });
    assert.equal(request.rawBody.toString(), '{"a": 1}');
    return run(request.idempotency.client, (status, body) => reply.code(status).send(body), request.idempotency);
  });
  app.post('/open', async () => ({ open: true }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
}

for (const [framework, server] of [['koa', koaServer], ['fastify', fastifyServer]]) {
  for (const sc of SCENARIOS) {
    test(`${framework}: ${sc.name}`, async () => {
      const pool = fakePool();
      const srv = await server(pool, sc.run);
      try {
        const r = await post(`${srv.url}/p`, '{"a": 1}', KEY);
        assert.equal(r.status, sc.status, r.text);
        if (sc.text !== undefined) assert.equal(r.text, sc.text);
      } finally {
        await srv.close();
      }
      assert.deepEqual(steps(pool.log), sc.steps);
      const complete = pool.log.find((l) => l.sql.includes('idem_complete'));
      if (complete) assert.equal(complete.params[2], sc.status);
    });
  }

  test(`${framework}: replay, 400 for a bad key and a body that is not JSON, before the handler`, async () => {
    const pool = fakePool({
      claim: () => ({ outcome: 'replay', http_status: 201, response_body: '{"id": 1}', response_headers: '{"Content-Type": "application/json"}' }),
    });
    const srv = await server(pool, () => assert.fail('handler ran'));
    try {
      const r = await post(`${srv.url}/p`, '{"a": 1}', KEY);
      assert.equal(r.status, 201);
      assert.equal(r.text, '{"id": 1}');
      assert.equal(r.headers.get('idempotent-replayed'), 'true');
      const bad = await post(`${srv.url}/p`, '{"a": 1}', { 'Idempotency-Key': 'k1,k2' });
      assert.equal(bad.status, 400);
      assert.equal(bad.headers.get('content-type'), 'application/problem+json');
      const missing = await post(`${srv.url}/p`, '{"a": 1}');
      assert.equal(missing.status, 400);
    } finally {
      await srv.close();
    }
    assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
  });
}

test('fastify: routes without config.idempotency are not touched', async () => {
  const pool = fakePool();
  const srv = await fastifyServer(pool, () => assert.fail('handler ran'));
  try {
    const r = await post(`${srv.url}/open`, '{}');
    assert.equal(r.status, 200);
    assert.deepEqual(r.json, { open: true });
  } finally {
    await srv.close();
  }
  assert.deepEqual(pool.log, []);
});
