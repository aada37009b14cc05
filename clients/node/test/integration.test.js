// Against a real PostgreSQL with the idempotency extension: set IDEM_TEST_DATABASE_URL (a libpq URI). The
// database gets CREATE EXTENSION idempotency and the ledger table of clients/schema.sql when they are missing.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import pg from 'pg';
import { CLAIM_SQL, COMPLETE_SQL, idempotency } from '../src/index.js';
import { authenticate, createApp } from '../service/app.js';
import { listen, post, quietLogger, testPool, unique, withServer } from './helpers.js';

const DATABASE_URL = process.env.IDEM_TEST_DATABASE_URL;
const skip = DATABASE_URL ? false : 'IDEM_TEST_DATABASE_URL is not set';

// Each case runs twice: on a pool of pipelined clients (pg's `pipeline: true`: BEGIN + claim and complete + COMMIT
// each in one round trip) and on a plain pool (one statement per round trip).
for (const pipeline of [true, false]) describe(`against PostgreSQL (${pipeline ? 'pipelined client' : 'plain client'})`, { skip }, () => {
  const run = unique('t');
  let pool;
  let srv;
  let n = 0;
  const account = () => `${run}_${++n}`;
  const auth = (acct, key) => ({ Authorization: `Bearer ${acct}`, ...(key === undefined ? {} : { 'Idempotency-Key': key }) });
  const stored = async (acct, key) =>
    (await pool.query('SELECT http_status FROM idempotency_keys WHERE scope = $1 AND key = $2 UNION ALL ' +
      'SELECT http_status FROM idempotency_keys_partitioned WHERE scope = $1 AND key = $2', [acct, key])).rows;
  const rows = async (acct) =>
    (await pool.query('SELECT amount_cents, currency, idempotency_key FROM ledger WHERE account = $1 ORDER BY id', [acct])).rows;

  before(async () => {
    pool = await testPool({ max: 8, pipeline });
    srv = await listen(createApp({ pool, faults: true, logger: quietLogger }));
  });

  after(async () => {
    await srv?.close();
    await pool?.end();
  });

  test('claim, then replay of the same request in another key order and spacing', async () => {
    const acct = account();
    const first = await post(`${srv.url}/payments`, '{"amount_cents": 1250, "currency": "EUR"}', auth(acct, '"pay-1"'));
    assert.equal(first.status, 201);
    assert.equal(first.headers.get('content-type'), 'application/json');
    assert.equal(first.headers.get('idempotent-replayed'), null);
    const id = first.json.payment_id;
    assert.ok(Number.isInteger(id));
    assert.deepEqual(first.json, { payment_id: id, account: acct, amount_cents: 1250, currency: 'EUR' });
    assert.equal(first.headers.get('location'), `/payments/${id}`);

    const again = await post(`${srv.url}/payments`, '{ "currency":"EUR",\n "amount_cents":1250 }', auth(acct, '"pay-1"'));
    assert.equal(again.status, 201);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(again.headers.get('location'), `/payments/${id}`);
    assert.equal(again.headers.get('content-type'), 'application/json');
    assert.equal(again.text, first.text, 'byte-identical');
    assert.deepEqual(await rows(acct), [{ amount_cents: '-1250', currency: 'EUR', idempotency_key: 'pay-1' }]);
  });

  test('the same key with another body: 422 idempotency-key-reused, nothing written; for another account (the scope) a payment of its own', async () => {
    const acct = account();
    const other = account();
    const first = await post(`${srv.url}/payments`, { amount_cents: 10, currency: 'EUR' }, auth(acct, 'k'));
    assert.equal(first.status, 201);
    const r = await post(`${srv.url}/payments`, { amount_cents: 11, currency: 'EUR' }, auth(acct, 'k'));
    assert.equal(r.status, 422);
    assert.equal(r.headers.get('content-type'), 'application/problem+json');
    assert.match(r.json.type, /\/idempotency-key-reused$/);
    assert.equal(r.json.status, 422);
    assert.equal((await rows(acct)).length, 1);
    const b = await post(`${srv.url}/payments`, { amount_cents: 10, currency: 'EUR' }, auth(other, 'k'));
    assert.equal(b.status, 201);
    assert.equal(b.headers.get('idempotent-replayed'), null);
    assert.notEqual(b.json.payment_id, first.json.payment_id);
  });

  test('a 503 from the handler or a database error in it (500): rolled back, not cached; the retry is claimed again', async () => {
    for (const [fault, status, detail] of [['503', 503, 'upstream unavailable'], ['db-error', 500, undefined]]) {
      const acct = account();
      const body = { amount_cents: 700, currency: 'GBP' };
      const r = await post(`${srv.url}/payments`, body, { ...auth(acct, 'k5'), 'X-Fault': fault });
      assert.equal(r.status, status);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
      assert.equal(r.json.status, status);
      if (detail) assert.equal(r.json.detail, detail);
      assert.deepEqual(await rows(acct), []);
      const retry = await post(`${srv.url}/payments`, body, auth(acct, 'k5'));
      assert.equal(retry.status, 201);
      assert.equal(retry.headers.get('idempotent-replayed'), null);
      assert.equal((await rows(acct)).length, 1);
    }
  });

  // a route of its own around `handler`, on the service's scope
  const insert = (h) => h.db.query(
    "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES ($1, -1, 'EUR', $2)",
    [h.idem.scope, h.idem.key]);
  const route = (handler, fn) => withServer('express route', pool, handler, fn, { scope: authenticate });

  test('a handler that throws after its insert: rolled back, nothing cached', async () => {
    let fail = true;
    const acct = account();
    await route(async (h) => {
      await insert(h);
      if (fail) throw new Error('the handler failed');
      h.answer(201, { ok: true });
    }, async (url) => {
      const r = await post(url, {}, auth(acct, 'kt'));
      assert.equal(r.status, 500);
      assert.match(r.json.type, /internal-error$/);
      assert.deepEqual(await rows(acct), []);
      fail = false;
      const retry = await post(url, {}, auth(acct, 'kt'));
      assert.equal(retry.status, 201);
      assert.equal(retry.headers.get('idempotent-replayed'), null);
      assert.equal((await rows(acct)).length, 1);
      const replay = await post(url, {}, auth(acct, 'kt'));
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
      assert.equal((await rows(acct)).length, 1);
    });
  });

  test('SQLSTATE 40001 in the handler: the whole transaction runs again, once in effect', async () => {
    const attempts = [];
    const acct = account();
    await route(async (h) => {
      attempts.push(h.idem.attempt);
      await insert(h);
      if (h.idem.attempt < 2) {
        await h.db.query("DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$");
      }
      h.answer(201, { attempt: h.idem.attempt });
    }, async (url) => {
      const r = await post(url, {}, auth(acct, 'kr'));
      assert.equal(r.status, 201);
      assert.deepEqual(r.json, { attempt: 2 });
      assert.deepEqual(attempts, [0, 1, 2]);
      assert.equal((await rows(acct)).length, 1);
    });
  });

  test('a validation error (422) is answered not executed: not stored, the corrected retry is claimed', async () => {
    const acct = account();
    const r = await post(`${srv.url}/payments`, { amount_cents: -5, currency: 'EUR' }, auth(acct, 'kv'));
    assert.equal(r.status, 422);
    assert.equal(r.headers.get('content-type'), 'application/problem+json');
    assert.match(r.json.type, /invalid-payment$/);
    const again = await post(`${srv.url}/payments`, { amount_cents: -5, currency: 'EUR' }, auth(acct, 'kv'));
    assert.equal(again.status, 422);
    assert.equal(again.headers.get('idempotent-replayed'), null);
    assert.deepEqual(await stored(acct, 'kv'), []);
    const fixed = await post(`${srv.url}/payments`, { amount_cents: 5, currency: 'EUR' }, auth(acct, 'kv'));
    assert.equal(fixed.status, 201);
    assert.equal(fixed.headers.get('idempotent-replayed'), null);
    assert.deepEqual(await stored(acct, 'kv'), [{ http_status: 201 }]);
  });

  test('a key completed by the 1.0 statements (a 1.2 client) replays through the 1.3 claim, the same bytes', async () => {
    const acct = account();
    const body = '{"amount_cents": 5, "currency": "EUR"}';
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      await c.query(CLAIM_SQL, ['old', 'POST', '/payments', body, null, acct]);
      await c.query(COMPLETE_SQL, ['old', 201, '{"payment_id": 7}',
        '{"Content-Type": "application/json", "Location": "/payments/7"}', acct]);
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    const r = await post(`${srv.url}/payments`, '{"currency":"EUR","amount_cents":5}', auth(acct, 'old'));
    assert.equal(r.status, 201);
    assert.equal(r.headers.get('idempotent-replayed'), 'true');
    assert.equal(r.headers.get('content-type'), 'application/json');
    assert.equal(r.headers.get('location'), '/payments/7');
    assert.equal(r.text, '{"payment_id": 7}');
    assert.deepEqual(await rows(acct), []);
  });

  test('amount_cents as written: 1e2, 100.0 and 2^53 are 422 as in Go and Python; 2^53 - 1 is paid exactly', async () => {
    const acct = account();
    for (const amount of ['1e2', '100.0', '9007199254740992']) {
      const r = await post(`${srv.url}/payments`, `{"amount_cents": ${amount}, "currency": "EUR"}`, auth(acct, 'ke'));
      assert.equal(r.status, 422, amount);
      assert.equal(r.json.detail, 'amount_cents must be an integer from 1 to 9007199254740991');
    }
    const max = '9007199254740991';
    const r = await post(`${srv.url}/payments`, `{"amount_cents": ${max}, "currency": "EUR"}`, auth(acct, 'ke'));
    assert.equal(r.status, 201);
    assert.match(r.text, /"amount_cents": ?9007199254740991[,}]/);
    assert.deepEqual((await rows(acct)).map((x) => x.amount_cents), [`-${max}`]);
  });

  test('an HTTP error thrown after the insert: 422 stored as sent with the debit, 502 rolled back', async () => {
    const acct = account();
    const body = { amount_cents: 7, currency: 'EUR' };
    const r = await post(`${srv.url}/payments`, body, { ...auth(acct, 'kf'), 'X-Fault': 'throw-422' });
    assert.equal(r.status, 422);
    assert.equal(r.headers.get('content-type'), 'application/problem+json');
    assert.equal((await rows(acct)).length, 1, 'a 4xx is committed with what was sent');
    const replay = await post(`${srv.url}/payments`, body, auth(acct, 'kf'));
    assert.equal(replay.status, 422);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal(replay.text, r.text);

    const b = await post(`${srv.url}/payments`, body, { ...auth(acct, 'kg'), 'X-Fault': 'throw-502' });
    assert.equal(b.status, 502);
    assert.deepEqual(await stored(acct, 'kg'), []);
    assert.equal((await rows(acct)).length, 1, 'the debit of a 502 was rolled back');
    assert.equal((await post(`${srv.url}/payments`, body, auth(acct, 'kg'))).status, 201);
  });

  test('the quoted and the bare form are one key, escapes decoded; several keys in one header: 400, neither consumed; a "," inside a quoted key is one key', async () => {
    const acct = account();
    const body = { amount_cents: 5, currency: 'EUR' };
    for (const key of ['ka,kb', 'ka, kb', '"ka", "kb"']) {
      const r = await post(`${srv.url}/payments`, body, auth(acct, key));
      assert.equal(r.status, 400, key);
      assert.match(r.json.type, /idempotency-key-invalid$/);
      assert.match(r.json.detail, /several/);
    }
    assert.equal((await post(`${srv.url}/payments`, body, auth(acct, '"ka"'))).status, 201);
    const bare = await post(`${srv.url}/payments`, body, auth(acct, 'ka'));
    assert.equal(bare.headers.get('idempotent-replayed'), 'true');
    const q = await post(`${srv.url}/payments`, body, auth(acct, '"ka,kb"'));
    assert.equal(q.status, 201);
    assert.equal(q.headers.get('idempotent-replayed'), null);
    assert.equal((await post(`${srv.url}/payments`, body, auth(acct, '"q\\"uote\\\\d"'))).status, 201);
    assert.deepEqual((await rows(acct)).map((r) => r.idempotency_key), ['ka', 'ka,kb', 'q"uote\\d']);
  });

  test('another method: 405 with Allow; GET /healthz; an unknown path: 404', async () => {
    for (const [method, path, allow] of [['GET', '/payments', 'POST'], ['PUT', '/payments', 'POST'],
      ['DELETE', '/payments-unprotected', 'POST'], ['POST', '/healthz', 'GET, HEAD']]) {
      const r = await fetch(`${srv.url}${path}`, { method });
      assert.equal(r.status, 405, `${method} ${path}`);
      assert.equal(r.headers.get('allow'), allow);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
    }
    assert.equal((await fetch(`${srv.url}/healthz`, { method: 'HEAD' })).status, 200);
    assert.deepEqual(await (await fetch(`${srv.url}/healthz`)).json(), { ok: true });
    assert.equal((await fetch(`${srv.url}/nowhere`)).status, 404);
  });

  test('a body that is not JSON (400) or over 1 MiB (413): answered before the claim, the key not consumed; exactly 1 MiB is accepted', async () => {
    const acct = account();
    const padded = (size) => {
      const core = '{"amount_cents": 9, "currency": "EUR"';
      return core + ' '.repeat(size - core.length - 1) + '}';
    };
    // not JSON, JSON that jsonb refuses, one byte over the limit
    for (const [body, status, type] of [['{"amount_cents": 5,', 400, 'request-body-not-json'],
      ['{"amount_cents": 5, "currency": "\\u0000"}', 400, 'request-body-not-json'],
      [padded(1048577), 413, 'request-too-large']]) {
      const r = await post(`${srv.url}/payments`, body, auth(acct, 'kj'));
      assert.equal(r.status, status);
      assert.match(r.json.type, new RegExp(`/${type}$`));
    }
    assert.deepEqual(await stored(acct, 'kj'), []);
    const ok = await post(`${srv.url}/payments`, padded(1048576), auth(acct, 'kj'));
    assert.equal(ok.status, 201);
    assert.equal(ok.headers.get('idempotent-replayed'), null);
  });

  test('missing or invalid Idempotency-Key: 400; missing or bad Authorization: 401', async () => {
    const acct = account();
    const body = { amount_cents: 5, currency: 'EUR' };
    const missing = await post(`${srv.url}/payments`, body, auth(acct));
    assert.equal(missing.status, 400);
    assert.match(missing.json.type, /idempotency-key-missing$/);
    for (const key of ['""', '"open', 'a b', 'x'.repeat(256)]) {
      const r = await post(`${srv.url}/payments`, body, auth(acct, key));
      assert.equal(r.status, 400, key);
      assert.match(r.json.type, /idempotency-key-invalid$/);
    }
    for (const authorization of [undefined, 'Basic abc', 'Bearer UPPER', 'Bearer ', `Bearer ${'a'.repeat(65)}`]) {
      const r = await post(`${srv.url}/payments`, body, {
        'Idempotency-Key': 'k', ...(authorization ? { Authorization: authorization } : {}),
      });
      assert.equal(r.status, 401, String(authorization));
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
    }
    assert.deepEqual(await rows(acct), []);
  });

  test('parallel clicks with the same key: one payment, the others 409 Retry-After: 1 at once', async () => {
    const acct = account();
    const body = { amount_cents: 3, currency: 'EUR' };
    // The holder sleeps 3 s; a service that waited for it would answer after 2.5 s, and 1.5 s leaves margin for
    // loaded cores.
    const slow = post(`${srv.url}/payments`, body, { ...auth(acct, 'kp'), 'X-Fault': 'sleep=3000' });
    await new Promise((r) => setTimeout(r, 500));
    const started = Date.now();
    const others = await Promise.all([1, 2, 3].map(() => post(`${srv.url}/payments`, body, auth(acct, 'kp'))));
    assert.ok(Date.now() - started < 1500, 'in_progress is answered without waiting');
    for (const r of others) {
      assert.equal(r.status, 409);
      assert.equal(r.headers.get('retry-after'), '1');
      assert.match(r.json.type, /idempotency-key-in-progress$/);
    }
    const first = await slow;
    assert.equal(first.status, 201);
    const replay = await post(`${srv.url}/payments`, body, auth(acct, 'kp'));
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal(replay.json.payment_id, first.json.payment_id);
    assert.equal((await rows(acct)).length, 1);
  });

  test('POST /payments-unprotected: the same handler in one transaction, no key', async () => {
    const acct = account();
    const body = { amount_cents: 42, currency: 'CHF' };
    const r = await post(`${srv.url}/payments-unprotected`, body, auth(acct));
    assert.equal(r.status, 201);
    assert.equal(r.json.amount_cents, 42);
    const r2 = await post(`${srv.url}/payments-unprotected`, body, auth(acct));
    assert.equal(r2.status, 201);
    assert.notEqual(r2.json.payment_id, r.json.payment_id);
    const err = await post(`${srv.url}/payments-unprotected`, body, { ...auth(acct), 'X-Fault': 'db-error' });
    assert.equal(err.status, 500);
    assert.equal((await rows(acct)).length, 2);
  });
});

// Through PgBouncer in transaction pooling (E2E_PGBOUNCER_URL: clients/run-tests.sh exports it, the e2e stack's
// bouncer; PgBouncer 1.18 keeps no named statement): a pipelined pool names the 1.3 statements, meets 26000 on a
// server connection that does not hold them, and goes on unnamed by itself.
const BOUNCER = process.env.E2E_PGBOUNCER_URL;
describe('through PgBouncer, a pipelined pool', { skip: BOUNCER ? false : 'E2E_PGBOUNCER_URL is not set' }, () => {
  test('a server connection swapped under a client connection: met at the claim, never after the handler', async () => {
    // PgBouncer hands out the server connection released last; a transaction held open by another client sends the
    // next one elsewhere. Each request runs on the client connection the test picks; the handler, which cannot be
    // run again (a middleware before the route), records the server's pid.
    const connections = [];
    for (let i = 0; i < 3; i++) {
      const c = new pg.Client({ connectionString: BOUNCER, pipeline: true });
      await c.connect();
      connections.push(Object.assign(c, { release() {} }));
    }
    const [c1, c2, holder] = connections;
    const run = unique('sw');
    const logged = [];
    let next;
    const app = express();
    const logger = { error() {}, info: (m) => logged.push(m) };
    app.use(idempotency({ pool: { connect: async () => next }, logger })(), express.json());
    const servers = [];
    app.post('/p', async (req, res) => {
      servers.push((await req.db.query('SELECT pg_backend_pid() AS pid')).rows[0].pid);
      res.status(req.body.status).json({});
    });
    const srv = await listen(app);
    const send = (client, key, status) => ((next = client),
      post(`${srv.url}/p`, { status }, { 'Idempotency-Key': `${run}-${key}` }).then((r) => r.status));
    try {
      assert.equal(await send(c1, 'a', 201), 201); // c1 prepares its claim and completion on server connection A
      await holder.query('BEGIN');
      await holder.query('SELECT 1'); // A, held
      assert.equal(await send(c2, 'b', 503), 503); // c2 prepares its claim on another one, B (rolled back)
      await holder.query('COMMIT'); // A is the one released last again
      // c2 on A, which holds c1's statements and not c2's: 26000 at the claim, run again unnamed. With one name for
      // every connection, the claim ran there as c1's and the completion's Parse failed after the handler (42P05).
      assert.equal(await send(c2, 'c', 201), 201);
      assert.equal(servers.length, 3, 'each handler ran once');
      assert.notEqual(servers[1], servers[0], 'b ran on another server connection than a');
      assert.equal(servers[2], servers[0], 'c ran on the server connection of a');
      assert.ok(logged.some((m) => /SQLSTATE 26000/.test(m)), logged.join('\n'));
      assert.equal(await send(c1, 'd', 201), 201, 'unnamed from then on');
    } finally {
      await srv.close();
      await Promise.all(connections.map((c) => c.end()));
    }
  });


  for (const prepared of ['auto', false]) {
    test(`prepared: ${prepared}: 30 keys at once, then again: 30 payments, then 30 replays`, async () => {
      const pool = new pg.Pool({ connectionString: BOUNCER, max: 6, pipeline: true });
      const srv = await listen(createApp({ pool, prepared, logger: quietLogger }));
      const acct = unique('pb');
      try {
        const round = () => Promise.all(Array.from({ length: 30 }, (_, i) => post(`${srv.url}/payments`,
          { amount_cents: 1 + i, currency: 'EUR' }, { Authorization: `Bearer ${acct}`, 'Idempotency-Key': `k${i}` })));
        const answers = [...await round(), ...await round()];
        const kinds = answers.map((r) => `${r.status}${r.headers.get('idempotent-replayed') ? ' replay' : ''}`).sort();
        assert.deepEqual(kinds, [...Array(30).fill('201'), ...Array(30).fill('201 replay')]);
        const { rows: [{ n }] } = await pool.query('SELECT count(*)::int AS n FROM ledger WHERE account = $1', [acct]);
        assert.equal(n, 30);
      } finally {
        await srv.close();
        await pool.end();
      }
    });
  }
});
