// The 1.4 rules of clients/CONTRACT.md (issue 41) in every adapter, on a fake pool: any-body (the framework's own
// form and multipart parsers after the middleware get the body whole; the claim gets its bytes and Content-Type),
// error-shape (renderProblem writes the middleware's own answers: Stripe's shape), expired (410 through the hook)
// and key-lifetime (Idempotency-Key-Expires from the claim's headers, none from 1.3's NULL on claimed).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import multer from 'multer';
import Koa from 'koa';
import Fastify from 'fastify';
import { fastifyIdempotency, idempotency, koaIdempotency } from '../src/index.js';
import { fakePool, listen, pgError, quietLogger, withServer } from './helpers.js';

const KEY = { 'Idempotency-Key': 'k1' };
const EXPIRES = 'Tue, 08 Dec 2026 10:30:00 GMT';
const FORM = 'application/x-www-form-urlencoded';

/** Stripe's error shape (CONTRACT.md error-shape). */
function stripe(problem) {
  return {
    status: problem.status,
    headers: { ...problem.headers, 'Stripe-Should-Retry': String(problem.status === 409) },
    body: { error: { type: 'idempotency_error', message: problem.detail } },
  };
}

async function send(url, body, headers) {
  const res = await fetch(url, { method: 'POST', headers, body });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: text ? JSON.parse(text) : undefined };
}

/** An app of `adapter` whose POST /p answers 201 with the form fields its framework's own parser read. */
async function formApp(adapter, pool) {
  const opts = { pool, logger: quietLogger };
  const fields = (body) => ({ ...body });
  if (adapter === 'express') {
    const app = express();
    app.post('/p', idempotency(opts)(express.urlencoded({ extended: false }), (req, res) => res.status(201).json(fields(req.body))));
    app.post('/m', idempotency(opts)(multer().none(), (req, res) => res.status(201).json(fields(req.body))));
    return listen(app);
  }
  if (adapter === 'koa') {
    const app = new Koa();
    app.use(koaIdempotency(opts));
    app.use(async (ctx) => {
      const chunks = []; // what a Koa body parser does: read ctx.req to its end
      for await (const chunk of ctx.req) chunks.push(chunk);
      ctx.status = 201;
      ctx.body = Object.fromEntries(new URLSearchParams(Buffer.concat(chunks).toString()));
    });
    return listen(app.callback());
  }
  const app = Fastify();
  await app.register(fastifyIdempotency, opts);
  app.addContentTypeParser(FORM, { parseAs: 'string' }, (req, body, done) => done(null, Object.fromEntries(new URLSearchParams(body))));
  app.post('/p', { config: { idempotency: true } }, async (request, reply) => reply.code(201).send(fields(request.body)));
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
}

for (const adapter of ['express', 'koa', 'fastify']) describe(adapter, () => {
  test('any-body: a form reaches the framework\'s own parser whole; the claim gets its bytes and Content-Type', async () => {
    const pool = fakePool();
    const srv = await formApp(adapter, pool);
    try {
      const r = await send(`${srv.url}/p`, 'amount_cents=12&currency=EUR', { 'Content-Type': FORM, ...KEY });
      assert.equal(r.status, 201, r.text);
      assert.deepEqual(r.json, { amount_cents: '12', currency: 'EUR' });
      const claim = pool.log.find((s) => s.sql.includes('idem_claim_request'));
      assert.equal(claim.params[5], FORM);
      assert.deepEqual(claim.params[6], Buffer.from('amount_cents=12&currency=EUR'));
      if (adapter === 'express') {
        const fd = new FormData();
        fd.append('amount_cents', '5');
        const m = await send(`${srv.url}/m`, fd, { ...KEY });
        assert.equal(m.status, 201, m.text);
        assert.deepEqual(m.json, { amount_cents: '5' });
        assert.match(pool.log.filter((s) => s.sql.includes('idem_claim_request'))[1].params[5], /^multipart\/form-data; boundary=/);
      }
      // over the limit: 413 at once, whatever the type
      const big = await send(`${srv.url}/p`, Buffer.alloc(1024 * 1024 + 1, 97), { 'Content-Type': 'application/octet-stream', ...KEY });
      assert.equal(big.status, 413);
    } finally {
      await srv.close();
    }
  });
});

test('express: a run again on 40001 hands the body to the route\'s parsers again (multer reads the stream anew)', async () => {
  let inserts = 0;
  const pool = fakePool({
    query(sql) {
      if (sql === 'INSERT' && ++inserts === 1) throw pgError('40001');
    },
  });
  const app = express();
  const seen = [];
  app.post('/m', idempotency({ pool, logger: quietLogger })(multer().none(), async (req, res) => {
    seen.push({ ...req.body });
    await req.db.query('INSERT');
    res.status(201).json(req.body);
  }));
  const srv = await listen(app);
  try {
    const fd = new FormData();
    fd.append('amount_cents', '9');
    const r = await send(`${srv.url}/m`, fd, KEY);
    assert.equal(r.status, 201, r.text);
    assert.deepEqual(seen, [{ amount_cents: '9' }, { amount_cents: '9' }]);
  } finally {
    await srv.close();
  }
});

for (const adapter of ['express route', 'express app.use', 'koa', 'fastify']) describe(adapter, () => {
  const served = (pool, handler, fn, options) => withServer(adapter, pool, handler, fn, options);
  const created = (h) => h.answer(201, { id: 1 });

  test('error-shape: renderProblem writes the middleware\'s answers in Stripe\'s shape; expired is 410', async () => {
    const outcomes = [
      ['in_progress', 409, 'true'], ['mismatch', 422, 'false'], ['expired', 410, 'false'],
    ];
    for (const [outcome, status, retry] of outcomes) {
      const pool = fakePool({ claim: () => ({ outcome, http_status: status }) });
      await served(pool, created, async (url) => {
        const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
        assert.equal(r.status, status, outcome);
        assert.equal(r.headers.get('content-type'), 'application/json');
        assert.equal(r.headers.get('stripe-should-retry'), retry);
        assert.equal(r.json.error.type, 'idempotency_error');
        assert.equal(typeof r.json.error.message, 'string');
        assert.equal(r.headers.get('retry-after'), status === 409 ? '1' : null);
      }, { renderProblem: stripe });
    }
    await served(fakePool(), created, async (url) => {
      const r = await send(url, '{}', { 'Content-Type': 'application/json' });
      assert.equal(r.status, 400);
      assert.deepEqual(r.json, { error: { type: 'idempotency_error', message: 'the Idempotency-Key header is required' } });
      assert.equal(r.headers.get('stripe-should-retry'), 'false');
    }, { renderProblem: stripe });
    // the handler's own answers are its own
    await served(fakePool(), (h) => h.answer(422, { mine: true }), async (url) => {
      const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
      assert.deepEqual([r.status, r.json, r.headers.get('stripe-should-retry')], [422, { mine: true }, null]);
    }, { renderProblem: stripe });
  });

  test('store-less: redact and storeBody: false reach the completion without what they drop; sent whole', async () => {
    for (const [options, want] of [
      [{ redact: ['/secret', '/none'] }, (p) => p[3] === 'application/json; charset=utf-8' &&
        JSON.parse(p[4])['Idempotent-Replay-Redacted'] === '/secret' && p[5].toString() === '{"id":1}'],
      [{ storeBody: false }, (p) => p[3] === null && JSON.parse(p[4])['Idempotent-Replay-Body'] === 'omitted' && p[5] === null],
    ]) {
      const pool = fakePool();
      await served(pool, (h) => h.answer(201, { id: 1, secret: 's3' }), async (url) => {
        const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
        assert.deepEqual(r.json, { id: 1, secret: 's3' });
      }, options);
      const complete = pool.log.find((x) => x.sql.includes('idem_complete_request'));
      assert.ok(want(complete.params), JSON.stringify(complete.params));
    }
  });

  test('expired without a hook: 410 problem+json idempotency-key-expired, nothing run', async () => {
    const pool = fakePool({ claim: () => ({ outcome: 'expired', http_status: 410 }) });
    await served(pool, () => assert.fail('the handler ran'), async (url) => {
      const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
      assert.equal(r.status, 410);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
      assert.match(r.json.type, /\/idempotency-key-expired$/);
    });
    assert.deepEqual(pool.log.map((s) => s.sql).filter((s) => /^(COMMIT|ROLLBACK)$/.test(s)), ['ROLLBACK']);
  });

  test('key-lifetime: Idempotency-Key-Expires from the claim\'s headers, added to the first answer, never stored; none from 1.3', async () => {
    const dated = JSON.stringify({ 'Idempotency-Key-Expires': EXPIRES });
    const claimed = fakePool({ claim: () => ({ outcome: 'claimed', response_headers: dated }) });
    await served(claimed, created, async (url) => {
      const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
      assert.equal(r.status, 201);
      assert.equal(r.headers.get('idempotency-key-expires'), EXPIRES);
    });
    const complete = claimed.log.find((s) => s.sql.includes('idem_complete_request'));
    assert.ok(!complete.params[4].includes('Idempotency-Key-Expires'), 'not stored: the replay has it from its claim');
    for (const [outcome, status] of [['replay', 201], ['mismatch', 422], ['in_progress', 409]]) {
      const pool = fakePool({
        claim: () => ({ outcome, http_status: status, response_body: '{}', response_headers: dated }),
      });
      await served(pool, created, async (url) => {
        const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
        assert.equal(r.status, status);
        assert.equal(r.headers.get('idempotency-key-expires'), EXPIRES, outcome);
      });
    }
    // a 5xx is not stored: no expiry on it
    const failing = fakePool({ claim: () => ({ outcome: 'claimed', response_headers: dated }) });
    await served(failing, (h) => h.answer(503, { error: 'down' }), async (url) => {
      const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
      assert.equal(r.status, 503);
      assert.equal(r.headers.get('idempotency-key-expires'), null);
    });
    await served(fakePool(), created, async (url) => {
      const r = await send(url, '{}', { 'Content-Type': 'application/json', ...KEY });
      assert.equal(r.headers.get('idempotency-key-expires'), null);
    });
  });
});

test('fastify: store-less per route in config.idempotency', async () => {
  const pool = fakePool();
  const app = Fastify();
  await app.register(fastifyIdempotency, { pool, logger: quietLogger });
  app.post('/r', { config: { idempotency: { redact: ['/card/number'] } } }, async () => ({ card: { number: '42', last4: '2' } }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  try {
    const r = await send(`http://127.0.0.1:${app.server.address().port}/r`, '{}', { 'Content-Type': 'application/json', ...KEY });
    assert.deepEqual(r.json, { card: { number: '42', last4: '2' } });
    const complete = pool.log.find((x) => x.sql.includes('idem_complete_request'));
    assert.equal(complete.params[5].toString(), '{"card":{"last4":"2"}}');
    assert.equal(JSON.parse(complete.params[4])['Idempotent-Replay-Redacted'], '/card/number');
  } finally {
    await app.close();
  }
});

// A 1.3 handler read the JSON body the middleware parsed (req.body, Koa's ctx.request.body) and mounted no parser
// of its own: it keeps working. A form is left to the framework's parsers (nothing set), and a parser after the
// middleware still reads the same bytes.
test('express and koa: a JSON body is in req.body as 1.3 left it, with no parser mounted; a form is not', async () => {
  const pool = fakePool();
  const app = express();
  app.post('/p', idempotency({ pool, logger: quietLogger })((req, res) => res.status(201).json({ body: req.body ?? null })));
  app.post('/j', idempotency({ pool, logger: quietLogger })(express.json(), (req, res) => res.status(201).json({ body: req.body })));
  const srv = await listen(app);
  const koa = new Koa();
  koa.use(koaIdempotency({ pool, logger: quietLogger }));
  koa.use(async (ctx) => { ctx.status = 201; ctx.body = { body: ctx.request.body ?? null }; });
  const ksrv = await listen(koa.callback());
  try {
    for (const url of [`${srv.url}/p`, `${srv.url}/j`, `${ksrv.url}/p`]) {
      const r = await send(url, '{"amount_cents": 7, "currency": "EUR"}', { 'Content-Type': 'application/json', ...KEY });
      assert.equal(r.status, 201, `${url}: ${r.text}`);
      assert.deepEqual(r.json, { body: { amount_cents: 7, currency: 'EUR' } }, url);
      const none = await send(url, Buffer.from('{"a": 1}'), { ...KEY }); // bytes: fetch sends no Content-Type, JSON to 1.3 and now
      assert.deepEqual(none.json, { body: { a: 1 } }, url);
    }
    for (const url of [`${srv.url}/p`, `${ksrv.url}/p`]) {
      const f = await send(url, 'amount_cents=7', { 'Content-Type': FORM, ...KEY });
      assert.deepEqual(f.json, { body: null }, url);
    }
  } finally {
    await srv.close();
    await ksrv.close();
  }
});
