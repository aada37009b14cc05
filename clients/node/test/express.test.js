// Express: app.use(idem()) before the routes, and the status committed is the status sent when a handler fails
// after a write: Express's own error handlers answer errors with an HTTP status (a 4xx is stored as sent, a 5xx
// rolled back), an error without one is rolled back. Against a fake pool; integration.test.js runs the real thing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { idempotency } from '../src/index.js';
import { fakePool, listen, pgError, post, quietLogger, steps } from './helpers.js';

const KEY = { 'Idempotency-Key': '"k1"' };

/** An error as http-errors makes them: Express's error handlers answer its `status`. */
function httpError(status, message) {
  return Object.assign(new Error(message), { status, expose: true });
}

/** An app with `app.use(idem())` before its routes, then the app's error handler. */
async function withUseApp(pool, routes, fn, { options = {} } = {}) {
  const app = express();
  const idem = idempotency({ pool, logger: quietLogger, ...options });
  app.get('/healthz', (req, res) => res.json({ ok: true }));
  app.use(idem());
  routes(app);
  // eslint-disable-next-line no-unused-vars
  app.use((err, req, res, next) => res.status(err.status || 500).json({ error: err.message }));
  const srv = await listen(app);
  try {
    await fn(srv.url);
  } finally {
    await srv.close();
  }
}

test('app.use(idem()) before the routes: the route runs in the claim\'s transaction and its answer is stored', async () => {
  const pool = fakePool();
  await withUseApp(pool, (app) => {
    app.post('/payments', async (req, res) => {
      assert.equal(req.idempotency.key, 'k1');
      assert.deepEqual(req.body, { a: 1 });
      await req.db.query('INSERT 1');
      res.status(201).set('Location', '/payments/1').json({ id: 1 });
    });
  }, async (url) => {
    const r = await post(`${url}/payments`, '{"a":1}', KEY);
    assert.equal(r.status, 201);
    assert.equal(r.headers.get('location'), '/payments/1');
    assert.equal(r.text, '{"id":1}', 'the first answer is the bytes stored');
    const health = await fetch(`${url}/healthz`);
    assert.equal(health.status, 200, 'GET passes through untouched');
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT']);
});

test('app.use(idem()): a route that throws an HTTP 4xx error after its insert: the 4xx the error handler sent is stored', async () => {
  const pool = fakePool();
  await withUseApp(pool, (app) => {
    app.post('/payments', async (req) => {
      await req.db.query('INSERT 1');
      throw httpError(422, 'card declined');
    });
  }, async (url) => {
    const r = await post(`${url}/payments`, '{}', KEY);
    assert.equal(r.status, 422, 'the status the error handler sent');
    assert.deepEqual(r.json, { error: 'card declined' });
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT']);
  const complete = pool.log[3].params;
  assert.equal(complete[2], 422);
  assert.deepEqual(complete[5], Buffer.from('{"error":"card declined"}'));
});

test('app.use(idem()): a 5xx after a write, thrown, passed to next(err) or answered, is rolled back', async () => {
  for (const route of [
    (req, res, next) => req.db.query('INSERT 1').then(() => next(httpError(502, 'provider down'))),
    async (req) => {
      await req.db.query('INSERT 1');
      throw new Error('a bug'); // no status: the app's error handler answers 500
    },
    async (req, res) => {
      await req.db.query('INSERT 1');
      res.status(503).json({});
    },
  ]) {
    const pool = fakePool();
    await withUseApp(pool, (app) => app.post('/payments', route), async (url) => {
      const r = await post(`${url}/payments`, '{}', KEY);
      assert.ok([500, 502, 503].includes(r.status), String(r.status));
    });
    assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'INSERT 1', 'ROLLBACK'], String(route));
  }
});

test('app.use(idem()): replay and 409 answered before the routes run', async () => {
  const pool = fakePool({
    claim: () => ({ outcome: 'replay', http_status: 201, response_body: '{"id": 1}', response_headers: '{"Content-Type": "application/json"}' }),
  });
  await withUseApp(pool, (app) => app.post('/payments', () => assert.fail('route ran')), async (url) => {
    const r = await post(`${url}/payments`, '{}', KEY);
    assert.equal(r.status, 201);
    assert.equal(r.text, '{"id": 1}');
    assert.equal(r.headers.get('idempotent-replayed'), 'true');
  });
});

test('app.use(idem()): 40001 at COMMIT after a downstream route cannot run it again: rolled back, 409', async () => {
  const pool = fakePool({ query: (sql) => (sql === 'COMMIT' ? Promise.reject(pgError('40001')) : undefined) });
  await withUseApp(pool, (app) => app.post('/payments', (req, res) => res.status(201).json({})), async (url) => {
    const r = await post(`${url}/payments`, '{}', KEY);
    assert.equal(r.status, 409);
    assert.equal(r.headers.get('retry-after'), '1');
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'complete', 'COMMIT', 'ROLLBACK']);
});

test('idem(handler): an HTTP error thrown after the insert is answered by Express\'s error handler; 4xx stored, 5xx not', async () => {
  for (const [status, expected] of [
    [422, ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT']],
    [502, ['BEGIN', 'claim', 'INSERT 1', 'ROLLBACK']],
  ]) {
    const pool = fakePool();
    const app = express();
    const idem = idempotency({ pool, logger: quietLogger });
    app.post('/p', idem(async (req, res) => {
      await req.db.query('INSERT 1');
      res.status(201); // a status set, then an error: the error's answer is what counts
      throw httpError(status, 'late');
    }));
    // eslint-disable-next-line no-unused-vars
    app.use((err, req, res, next) => res.status(err.status).json({ error: err.message }));
    const srv = await listen(app);
    try {
      const r = await post(`${srv.url}/p`, '{}', KEY);
      assert.equal(r.status, status);
      assert.deepEqual(r.json, { error: 'late' });
    } finally {
      await srv.close();
    }
    assert.deepEqual(steps(pool.log), expected, String(status));
  }
});

test('req.idempotency.notExecuted(): the answer is sent, rolled back, not stored (the key is free again)', async () => {
  const pool = fakePool();
  const app = express();
  const idem = idempotency({ pool, logger: quietLogger });
  app.post('/p', idem((req, res) => {
    req.idempotency.notExecuted();
    res.status(422).json({ error: 'amount_cents must be > 0' });
  }));
  const srv = await listen(app);
  try {
    const r = await post(`${srv.url}/p`, '{}', KEY);
    assert.equal(r.status, 422);
    assert.deepEqual(r.json, { error: 'amount_cents must be > 0' });
  } finally {
    await srv.close();
  }
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
});

test('without a pipelined client: the same named statements, one round trip each', async () => {
  const pool = fakePool({ pipeline: false });
  const app = express();
  app.post('/p', idempotency({ pool, logger: quietLogger })(async (req, res) => {
    await req.db.query('INSERT 1');
    res.status(201).json({});
  }));
  const srv = await listen(app);
  try {
    assert.equal((await post(`${srv.url}/p`, '{}', KEY)).status, 201);
  } finally {
    await srv.close();
  }
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT']);
  assert.deepEqual(pool.log.filter((l) => l.queued), [], 'each statement after the answer to the one before');
  assert.match(pool.log[1].name, /^idem_claim_request_/);
  assert.match(pool.log[3].name, /^idem_complete_request_/);
});
