// Every adapter (Express as a route and as app.use(), node:http, NestJS, Koa, Fastify) runs a request only
// from a body that arrived whole, and refuses a body over the limit before reading it. Raw sockets to a real
// listening server: a client that sends 37 of its 600 announced bytes and hangs up must leave nothing claimed and
// nothing written, so that its proper retry is claimed and executed; headers announcing more than the limit, or a
// chunked body passing it, get 413 problem+json at once, while the client is still sending.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { SERVERS, fakePool, testPool, unique } from './helpers.js';

const DATABASE_URL = process.env.IDEM_TEST_DATABASE_URL;
const LIMIT = 1024; // a small body limit, so the tests send little
// 37 bytes of JSON, padded with white space to the 600 bytes announced (the same request: jsonb ignores spaces)
const JSON37 = '{"amount_cents":100,"currency":"EUR"}';
const FULL = JSON37.padEnd(600, ' ');
// An answer that a server waiting for the rest of the body never gives: a generous bound for 2 busy cores.
const BOUND_MS = 5000;

/** The handler of every adapter: the ledger insert in the request's transaction. */
async function pay(h) {
  const { rows: [{ id }] } = await h.db.query(
    'INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id',
    [h.idem.scope, -h.body.amount_cents, h.body.currency, h.idem.key]);
  h.answer(201, { id: Number(id) });
}

const ADAPTERS = Object.fromEntries(Object.entries(SERVERS).map(([name, make]) => [name,
  (pool) => make(pool, pay, { bodyLimit: LIMIT })]));

function head(port, headers) {
  const lines = [`POST /p HTTP/1.1`, `Host: 127.0.0.1:${port}`, 'Content-Type: application/json',
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
  return `${lines.join('\r\n')}\r\n\r\n`;
}

/** A minimal HTTP/1.1 response from the bytes read so far, or null when it is not complete yet. */
function parseResponse(data, ended) {
  const end = data.indexOf('\r\n\r\n');
  if (end < 0) return null;
  const [statusLine, ...lines] = data.subarray(0, end).toString('latin1').split('\r\n');
  const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
  const body = data.subarray(end + 4);
  const length = Number(headers['content-length']);
  if (!ended && !(body.length >= length)) return null;
  return { status: Number(statusLine.split(' ')[1]), headers, text: body.subarray(0, length || undefined).toString() };
}

/**
 * Write `first`, then `rest` chunks every 5 ms, never ending the body; resolves with the response and the time it
 * took, or rejects after BOUND_MS without one.
 */
function sendUnfinished(url, first, rest = []) {
  const port = Number(new URL(url).port);
  return new Promise((resolve, reject) => {
    const started = Date.now();
    let timer;
    const socket = net.connect(port, '127.0.0.1', () => {
      socket.write(first);
      timer = setInterval(() => rest.length && socket.writable && socket.write(rest.shift()), 5);
    });
    let data = Buffer.alloc(0);
    const deadline = setTimeout(() => finish(new Error(`no answer within ${BOUND_MS} ms`)), BOUND_MS);
    const finish = (err, r) => {
      clearInterval(timer);
      clearTimeout(deadline);
      socket.destroy();
      if (err) reject(err);
      else resolve({ ...r, ms: Date.now() - started, unsent: rest.length });
    };
    const check = (ended) => {
      const r = parseResponse(data, ended);
      if (r) finish(null, r);
      else if (ended) finish(new Error('the connection ended without a response'));
    };
    socket.on('data', (d) => check(((data = Buffer.concat([data, d])), false)));
    socket.on('end', () => check(true));
    socket.on('error', () => check(true));
  });
}

describe('413 before reading the body, in every adapter', () => {
  const chunk = (n) => `${n.toString(16)}\r\n${' '.repeat(n)}\r\n`;
  for (const [name, make] of Object.entries(ADAPTERS)) {
    test(`${name}: a Content-Length over the limit is answered 413 from the headers alone; a chunked body is cut off as soon as it passes the limit`, async () => {
      const pool = fakePool();
      const srv = await make(pool);
      const port = new URL(srv.url).port;
      try {
        for (const [first, rest] of [
          [head(port, { 'Idempotency-Key': 'k1', 'Content-Length': String(LIMIT + 1) }), []],
          // 4 x 300 bytes pass the 1024-byte limit with the fourth; 40 more chunks would follow, and never the end
          [head(port, { 'Idempotency-Key': 'k1', 'Transfer-Encoding': 'chunked' }) + chunk(300),
            Array.from({ length: 43 }, () => chunk(300))],
        ]) {
          const r = await sendUnfinished(srv.url, first, rest);
          assert.equal(r.status, 413, `${r.text} ${JSON.stringify(r.headers)}`);
          assert.equal(r.headers['content-type'], 'application/problem+json');
          assert.match(JSON.parse(r.text).type, /\/request-too-large$/);
          if (first.includes('chunked')) assert.ok(r.unsent > 0, 'answered while the client was still sending');
        }
      } finally {
        await srv.close();
      }
      assert.equal(pool.connects, 0, 'nothing claimed');
    });
  }
});


describe('a body cut short is never run, in every adapter', { skip: DATABASE_URL ? false : 'IDEM_TEST_DATABASE_URL is not set' }, () => {
  const run = unique('b');
  let pool;
  before(async () => {
    pool = await testPool({ max: 4 });
  });
  after(() => pool?.end());

  let n = 0;
  for (const [name, make] of Object.entries(ADAPTERS)) {
    test(`${name}: Content-Length 600, 37 bytes, hang up: nothing claimed or written; the retry is claimed and run`, async () => {
      const account = `${run}_${++n}`;
      let connects = 0;
      const counted = { connect: () => ((connects += 1), pool.connect()) };
      const srv = await make(counted);
      try {
        const port = Number(new URL(srv.url).port);
        const closed = new Promise((resolve) => {
          srv.server.once('connection', (s) => s.once('close', resolve));
        });
        const socket = net.connect(port, '127.0.0.1');
        await new Promise((resolve) => socket.once('connect', resolve));
        socket.write(head(port, { 'Idempotency-Key': 'cut', 'X-Account': account, 'Content-Length': '600' }) + JSON37);
        await new Promise((resolve) => setTimeout(resolve, 100)); // the server has read the 37 bytes
        socket.destroy();
        await closed;
        // What a server that took the 37 bytes for the whole body does next (claim) follows the close at once.
        await new Promise((resolve) => setTimeout(resolve, 200));
        assert.equal(connects, 0, 'no connection taken, nothing claimed');
        const keys = await pool.query('SELECT key FROM idempotency_keys WHERE scope = $1 UNION ALL ' +
          'SELECT key FROM idempotency_keys_partitioned WHERE scope = $1', [account]);
        assert.deepEqual(keys.rows, [], 'no key stored');

        const retry = await fetch(`${srv.url}/p`, {
          method: 'POST', body: FULL,
          headers: { 'Content-Type': 'application/json', 'Idempotency-Key': 'cut', 'X-Account': account },
        });
        assert.equal(retry.status, 201, await retry.clone().text());
        assert.equal(retry.headers.get('idempotent-replayed'), null, 'the retry is run, not a replay');
        await retry.text();
        const ledger = await pool.query('SELECT amount_cents FROM ledger WHERE account = $1', [account]);
        assert.deepEqual(ledger.rows, [{ amount_cents: '-100' }]);
      } finally {
        await srv.close();
      }
    });
  }
});
