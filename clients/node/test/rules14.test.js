// The 1.4 rules of clients/CONTRACT.md (issue 41) against PostgreSQL: any-body (the reference service reads form,
// multipart and JSON payments, POST /documents stores any body; the framework's own parsers after the middleware
// get the body whole) and store-less (the stored row holds neither the redacted members nor an omitted body).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { createHash } from 'node:crypto';
import { idempotency } from '../src/index.js';
import { createApp } from '../service/app.js';
import { listen, quietLogger, testPool, unique } from './helpers.js';

const skip = process.env.IDEM_TEST_DATABASE_URL ? false : 'IDEM_TEST_DATABASE_URL is not set';

async function send(url, body, headers) {
  const res = await fetch(url, { method: 'POST', headers, body });
  const bytes = Buffer.from(await res.arrayBuffer());
  return { status: res.status, headers: res.headers, bytes, json: bytes.length ? JSON.parse(bytes) : undefined };
}

describe('1.4 rules against PostgreSQL', { skip }, () => {
  const run = unique('r');
  let pool;
  let srv;
  let n = 0;
  const account = () => `${run}_${++n}`;
  const auth = (acct, key, type) => ({
    Authorization: `Bearer ${acct}`, 'Idempotency-Key': key, ...(type ? { 'Content-Type': type } : {}),
  });
  const storedRow = async (scope, key) => (await pool.query(
    'SELECT response_headers::text AS headers, response_bytes, response_content_type FROM idempotency_keys ' +
    'WHERE scope = $1 AND key = $2', [scope, key])).rows[0];

  before(async () => {
    pool = await testPool({ max: 4, pipeline: true });
    srv = await listen(createApp({ pool, logger: quietLogger }));
  });
  after(async () => {
    await srv?.close();
    await pool?.end();
  });

  test('any-body: a form and a multipart payment are charged once and replayed; another content type is 422', async () => {
    const acct = account();
    const form = 'amount_cents=1250&currency=EUR';
    const first = await send(`${srv.url}/payments`, form, auth(acct, 'f1', 'application/x-www-form-urlencoded'));
    assert.equal(first.status, 201);
    assert.equal(first.json.amount_cents, 1250);
    const again = await send(`${srv.url}/payments`, form, auth(acct, 'f1', 'application/x-www-form-urlencoded'));
    assert.equal(again.status, 201);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(again.bytes, first.bytes);
    const asText = await send(`${srv.url}/payments`, form, auth(acct, 'f1', 'text/plain'));
    assert.equal(asText.status, 422);

    const fd = new FormData();
    fd.append('amount_cents', '300');
    fd.append('currency', 'USD');
    const multipart = await send(`${srv.url}/payments`, fd, auth(acct, 'm1'));
    assert.equal(multipart.status, 201, multipart.bytes.toString());
    assert.equal(multipart.json.amount_cents, 300);
    const bad = await send(`${srv.url}/payments`, 'amount_cents=1e2&currency=EUR', auth(acct, 'f2', 'application/x-www-form-urlencoded'));
    assert.equal(bad.status, 422);
    const notJson = await send(`${srv.url}/payments`, 'hello', auth(acct, 'f3', 'text/plain'));
    assert.equal(notJson.status, 400);
    assert.match(notJson.json.type, /request-body-not-json$/);
    const { rows } = await pool.query('SELECT amount_cents FROM ledger WHERE account = $1 ORDER BY id', [acct]);
    assert.deepEqual(rows.map((r) => Number(r.amount_cents)), [-1250, -300]);
  });

  test('any-body: a form ride (lease mode) rides once and replays; the same fields as JSON are another request', async () => {
    const acct = account();
    const form = 'amount_cents=700&currency=GBP';
    const first = await send(`${srv.url}/rides`, form, auth(acct, 'r1', 'application/x-www-form-urlencoded'));
    assert.equal(first.status, 201, first.bytes.toString());
    assert.equal(first.json.amount_cents, 700);
    const again = await send(`${srv.url}/rides`, form, auth(acct, 'r1', 'application/x-www-form-urlencoded'));
    assert.deepEqual([again.status, again.headers.get('idempotent-replayed')], [201, 'true']);
    assert.deepEqual(again.bytes, first.bytes);
    const json = await send(`${srv.url}/rides`, '{"amount_cents": 700, "currency": "GBP"}', auth(acct, 'r1', 'application/json'));
    assert.equal(json.status, 422);
    const bad = await send(`${srv.url}/rides`, 'amount_cents=1.0&currency=GBP', auth(acct, 'r2', 'application/x-www-form-urlencoded'));
    assert.equal(bad.status, 422);
    const { rows } = await pool.query('SELECT count(*)::int AS n FROM rides WHERE account = $1', [acct]);
    assert.equal(rows[0].n, 1);
  });

  test('any-body: POST /documents stores text, binary and empty bodies as their bytes', async () => {
    const acct = account();
    for (const [i, body, type] of [[1, 'plain words', 'text/plain'], [2, Buffer.from([0, 255, 1, 128]), 'application/octet-stream'],
      [3, '', undefined]]) {
      const r = await send(`${srv.url}/documents`, Buffer.from(body), auth(acct, `d${i}`, type));
      assert.equal(r.status, 201);
      const bytes = Buffer.from(body);
      assert.deepEqual(r.json, {
        document_id: r.json.document_id, content_type: type ?? null, bytes: bytes.length,
        sha256: createHash('sha256').update(bytes).digest('hex'),
      });
      assert.equal(r.headers.get('location'), `/documents/${r.json.document_id}`);
      const again = await send(`${srv.url}/documents`, Buffer.from(body), auth(acct, `d${i}`, type));
      assert.deepEqual(again.bytes, r.bytes);
      const { rows: [doc] } = await pool.query('SELECT body FROM documents WHERE id = $1', [r.json.document_id]);
      assert.deepEqual(doc.body, bytes);
    }
    const other = await send(`${srv.url}/documents`, Buffer.from([0, 255, 1, 129]), auth(acct, 'd2', 'application/octet-stream'));
    assert.equal(other.status, 422);
  });

  test('store-less: redacted members and an omitted body never reach the stored row; replays say so', async () => {
    const scope = account();
    const idem = idempotency({ pool, logger: quietLogger, scope: () => scope });
    const app = express();
    const secret = { id: 7, api_key: 'sk_live_SECRET', card: { number: '4242424242424242', last4: '4242' } };
    app.post('/keys', idem({ redact: ['/api_key', '/card/number', '/absent'] }, express.json(), (req, res) => {
      assert.deepEqual(req.body, { name: 'k' }); // express.json() after the middleware reads the body
      res.status(201).json(secret);
    }));
    app.post('/tokens', idem({ storeBody: false }, (req, res) => res.status(201).set('Location', '/t/1').json(secret)));
    const local = await listen(app);
    try {
      const headers = { 'Content-Type': 'application/json', 'Idempotency-Key': 'x1' };
      const first = await send(`${local.url}/keys`, '{"name": "k"}', headers);
      assert.deepEqual(first.json, secret); // the first answer is sent whole
      const row = await storedRow(scope, 'x1');
      assert.ok(!row.response_bytes.toString().includes('SECRET') && !row.response_bytes.includes('4242424242424242'));
      assert.equal(JSON.parse(row.headers)['Idempotent-Replay-Redacted'], '/api_key, /card/number');
      const replay = await send(`${local.url}/keys`, '{"name": "k"}', headers);
      assert.deepEqual(replay.json, { id: 7, card: { last4: '4242' } });
      assert.equal(replay.headers.get('idempotent-replay-redacted'), '/api_key, /card/number');

      const t1 = await send(`${local.url}/tokens`, '{}', headers);
      assert.equal(t1.status, 422); // another route with key x1: another request
      const h2 = { ...headers, 'Idempotency-Key': 'x2' };
      assert.deepEqual((await send(`${local.url}/tokens`, '{}', h2)).json, secret);
      const row2 = await storedRow(scope, 'x2');
      assert.equal(row2.response_bytes, null);
      assert.equal(row2.response_content_type, null);
      assert.equal(JSON.parse(row2.headers)['Idempotent-Replay-Body'], 'omitted');
      const replay2 = await send(`${local.url}/tokens`, '{}', h2);
      assert.equal(replay2.status, 201);
      assert.equal(replay2.bytes.length, 0);
      assert.equal(replay2.headers.get('location'), '/t/1');
      assert.equal(replay2.headers.get('idempotent-replay-body'), 'omitted');
    } finally {
      await local.close();
    }
  });
});
