// runLease (lease mode): options checked without a database; against a real PostgreSQL (IDEM_TEST_DATABASE_URL):
// the steps, the replay, a failed step and a 5xx resuming at the recovery point, a stalled holder fenced off
// (55000 before its write), a process killed mid-step resumed by a retry, the heartbeat keeping a slow step's
// lease. Wall-time cases use leases of seconds and poll for what they wait for, so they hold with both cores busy.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { CapturedResponse, LeaseLostError, jsonResponse, problem, runLease } from '../src/index.js';
import { LEASE_SQL } from '../src/lease.js';
import { storedForm } from '../src/responses.js';
import { createApp } from '../service/app.js';
import { listen, post, quietLogger, testPool, unique } from './helpers.js';

const DATABASE_URL = process.env.IDEM_TEST_DATABASE_URL;
const skip = DATABASE_URL ? false : 'IDEM_TEST_DATABASE_URL is not set';

const fakePool = { connect() {}, query() {} };
const finish = async () => jsonResponse(201, {});

describe('runLease options', () => {
  const bad = [
    [null, 'k', { path: '/t', body: '{}', finish }, /pool must be a pg.Pool/],
    [fakePool, '', { path: '/t', body: '{}', finish }, /key must be a non-empty string/],
    [fakePool, 'k', { path: '/t', body: '{}' }, /options.finish/],
    [fakePool, 'k', { path: '/t', body: 'not json', finish }, /body must be the request body as JSON text/],
    [fakePool, 'k', { body: '{}', finish }, /path and options.method/],
    [fakePool, 'k', { path: '/t', body: '{}', finish, leaseSeconds: 0 }, /leaseSeconds/],
    [fakePool, 'k', { path: '/t', body: '{}', finish, leaseSeconds: 1, heartbeatMs: 1000 }, /heartbeatMs/],
    [fakePool, 'k', { path: '/t', body: '{}', finish, steps: [{ name: '', run() {} }] }, /steps\[0\]\.name/],
    [fakePool, 'k', { path: '/t', body: '{}', finish, steps: [{ name: 'a' }] }, /steps\[0\]\.run must be a function/],
    [fakePool, 'k', { path: '/t', body: '{}', finish, steps: [{ name: 'a', run() {} }, { name: 'a', run() {} }] },
      /two steps are named "a"/],
    [fakePool, 'k', { path: '/t', body: '{}', finish, scope: 7 }, /scope must be a string/],
    [fakePool, 'k', { path: '/t', body: '{}', finish, ttl: 60 }, /ttl must be interval text/],
    [fakePool, 'k', { requestHash: 'h1', finish }, /requestHash must be 64 hexadecimal digits/],
  ];
  for (const [pool, key, options, message] of bad) {
    test(`refused before any query: ${message.source}`, async () => {
      await assert.rejects(runLease(pool, key, options), (e) => e instanceof TypeError && message.test(e.message));
    });
  }
});

/** Call attempt() until it answers something else than 409 in progress (a live lease), at most `seconds`. */
async function until(attempt, seconds = 20) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const r = await attempt();
    if (r.status !== 409) return r;
    if (Date.now() > deadline) assert.fail(`still 409 after ${seconds} s`);
    await sleep(100);
  }
}

// The holder's statements go in one round trip per pair on a `pipeline: true` pool, else one at a time; both ways
// run every case.
for (const pipeline of [false, true]) describe(`runLease against PostgreSQL (${pipeline ? 'pipelined client' : 'plain client'})`, { skip }, () => {
  const run = unique('l');
  let pool;
  let n = 0;
  const account = () => `${run}_${++n}`;

  before(async () => {
    pool = await testPool({ max: 12, pipeline });
    // what the steps write locally, one row per (step, holder) write
    await pool.query('CREATE TABLE IF NOT EXISTS lease_test_writes (scope text NOT NULL, key text NOT NULL, ' +
      'step text NOT NULL, holder text NOT NULL, fencing bigint)');
  });

  after(async () => {
    await pool?.end();
  });

  const writes = async (scope, key) =>
    (await pool.query('SELECT step, holder, fencing FROM lease_test_writes WHERE scope = $1 AND key = $2 ORDER BY step, holder',
      [scope, key])).rows;

  /** A step that records itself (what it saw) and writes one row in its transaction. */
  const step = (name, holder, seen, extra = async () => {}) => ({
    name,
    async run(ctx) {
      seen.push({ name, holder, point: ctx.recoveryPoint, state: { ...ctx.state }, fencing: ctx.fencingNumber });
      await extra(ctx);
      await ctx.transaction(async (client) => {
        await client.query('INSERT INTO lease_test_writes VALUES ($1, $2, $3, $4, $5)',
          [ctx.scope, ctx.key, name, holder, ctx.fencingNumber]);
        ctx.state[name] = holder;
      });
    },
  });

  const go = (scope, key, steps, more = {}) => runLease(pool, key, {
    scope, path: '/t', body: '{"a": 1}', leaseSeconds: 5, steps, logger: quietLogger,
    finish: async (client, ctx) => jsonResponse(201, { done: ctx.state, point: ctx.recoveryPoint }, [['Location', '/t/1']]),
    ...more,
  });

  test('every step once, then a byte-identical replay; another body is a mismatch', async () => {
    const acct = account();
    const seen = [];
    const first = await go(acct, 'k', [step('one', 'a', seen), step('two', 'a', seen)]);
    assert.equal(first.status, 201);
    assert.equal(first.header('Location'), '/t/1');
    assert.deepEqual(JSON.parse(first.body), { done: { one: 'a', two: 'a' }, point: 'two' });
    assert.deepEqual(seen.map((s) => [s.name, s.point, s.state]), [['one', null, {}], ['two', 'one', { one: 'a' }]]);
    // 1.2 hands a fencing number (a BigInt); 1.1 has none (null)
    const { rows: [{ v }] } = await pool.query("SELECT extversion AS v FROM pg_extension WHERE extname = 'idempotency'");
    if (v === '1.1') assert.equal(seen[0].fencing, null);
    else assert.equal(typeof seen[0].fencing, 'bigint');
    assert.equal(seen[1].fencing, seen[0].fencing);

    const again = await go(acct, 'k', [step('one', 'b', seen), step('two', 'b', seen)]);
    assert.equal(again.status, 201);
    assert.equal(again.header('Idempotent-Replayed'), 'true');
    assert.equal(again.header('Location'), '/t/1');
    assert.ok(again.body.equals(first.body), `${again.body} != ${first.body}`);
    assert.equal(seen.length, 2, 'a step ran again on a replay');

    const other = await go(acct, 'k', [], { body: '{"a": 2}' });
    assert.equal(other.status, 422);
    assert.match(JSON.parse(other.body).type, /idempotency-key-reused$/);
    assert.deepEqual(await writes(acct, 'k'), [
      { step: 'one', holder: 'a', fencing: seen[0].fencing === null ? null : String(seen[0].fencing) },
      { step: 'two', holder: 'a', fencing: seen[0].fencing === null ? null : String(seen[0].fencing) }]);
  });

  test('store-less in lease mode: the redacted members and an omitted body are not in the stored row', async () => {
    const acct = account();
    const secret = { ride: 1, card: { number: '4242424242424242' } };
    const finish = async () => jsonResponse(201, secret);
    const row = async (key) => (await pool.query('SELECT response_bytes, response_body::text AS body, ' +
      'response_headers::text AS headers FROM idempotency_keys WHERE scope = $1 AND key = $2', [acct, key])).rows[0];
    const first = await go(acct, 'r', [], { finish, redact: ['/card/number'] });
    assert.deepEqual(JSON.parse(first.body), secret); // sent whole
    const stored = await row('r');
    assert.ok(!`${stored.response_bytes}${stored.body}`.includes('4242424242424242'));
    assert.equal(JSON.parse(stored.headers)['Idempotent-Replay-Redacted'], '/card/number');
    const replay = await go(acct, 'r', [], { finish, redact: ['/card/number'] });
    assert.deepEqual(JSON.parse(replay.body), { ride: 1, card: {} });
    assert.equal(replay.header('Idempotent-Replay-Redacted'), '/card/number');

    await go(acct, 'o', [], { finish, storeBody: false });
    const omitted = await row('o');
    assert.equal(omitted.response_bytes, null);
    assert.equal(omitted.body, null);
    assert.equal(JSON.parse(omitted.headers)['Idempotent-Replay-Body'], 'omitted');
    const again = await go(acct, 'o', [], { finish, storeBody: false });
    assert.deepEqual([again.status, again.body.length, again.header('Idempotent-Replay-Body')], [201, 0, 'omitted']);
  });

  test('a requestHash of the caller fingerprints instead of method, path and body', async () => {
    const acct = account();
    const byHash = (hash) => runLease(pool, 'k', {
      scope: acct, requestHash: createHash('sha256').update(hash).digest('hex'), ttl: '1 hour', logger: quietLogger,
      steps: [], finish: async () => jsonResponse(201, { hash }),
    });
    assert.equal((await byHash('h1')).status, 201);
    const again = await byHash('h1');
    assert.equal(again.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(JSON.parse(again.body), { hash: 'h1' });
    assert.equal((await byHash('h2')).status, 422);
  });

  test("finish's answer replays byte for byte with its type: HTML, and JSON that jsonb would spell otherwise", async () => {
    const acct = account();
    for (const [type, text] of [['text/html; charset=utf-8', '<p>caf\u00e9</p>\n'], ['application/json', '{"b": 2,  "a": [1.0, 1e2]}']]) {
      const finish = async () => new CapturedResponse(201, [['Content-Type', type]], Buffer.from(text));
      const answers = [await go(acct, type, [], { finish }), await go(acct, type, [], { finish })];
      assert.deepEqual(answers.map((r) => [r.body.toString(), r.header('Content-Type'), r.header('Idempotent-Replayed')]),
        [[text, type, undefined], [text, type, 'true']]);
    }
  });

  test('a key completed as jsonb by idem_lease_complete (as 1.2 clients did) still replays, JSON or text', async () => {
    const acct = account();
    for (const [key, answer, body] of [['json', jsonResponse(201, { b: 2, a: 1 }, [['Location', '/t/1']]), '{"a": 1, "b": 2}'],
      ['text', new CapturedResponse(201, [['Content-Type', 'text/plain']], Buffer.from('ok')), 'ok']]) {
      const { rows: [{ lease_token: token }] } = await pool.query(LEASE_SQL, [key, 'POST', '/t', '{"a": 1}', 60, null, acct]);
      const stored = storedForm(answer); // what 1.2 clients stored, and how
      await pool.query('SELECT idem_lease_complete($1, $2, 201, $3, $4, $5)', [key, token, stored.body, stored.headers, acct]);
      const r = await go(acct, key, []);
      assert.equal(r.body.toString(), body);
      // 1.4 (CONTRACT.md key-lifetime): the server adds the key's expiry to the stored headers
      assert.match(r.header('Idempotency-Key-Expires'), / GMT$/);
      assert.deepEqual(Object.fromEntries(r.headers.filter(([k]) => k !== 'Idempotency-Key-Expires')),
        { ...Object.fromEntries(answer.headers), 'Idempotent-Replayed': 'true' });
    }
  });

  test('round trips: the lease, then per transaction BEGIN with the fence and the checkpoint or completion with COMMIT', { skip: !pipeline && 'counted on a pipelined client' }, async () => {
    const acct = account();
    const calls = [];
    // the pool as runLease sees it, counting round trips: statements sent in one turn of the event loop (before any
    // answer can arrive) share one
    let turn = false;
    const sent = (text) => {
      if (!turn) calls.push(text.slice(0, 40));
      turn = true;
      queueMicrotask(() => (turn = false));
    };
    const counting = {
      query: (text, params) => (sent(text), pool.query(text, params)),
      async connect() {
        const client = await pool.connect();
        return new Proxy(client, {
          get(target, prop) {
            if (prop === 'query') return (config, params) => (sent(config.text ?? config), target.query(config, params));
            const v = target[prop];
            return typeof v === 'function' ? v.bind(target) : v;
          },
        });
      },
    };
    const write = (client, ctx) => client.query('INSERT INTO lease_test_writes VALUES ($1, $2, $3, $4, NULL)',
      [ctx.scope, ctx.key, ctx.step ?? 'finish', 'a']);
    const r = await runLease(counting, 'k', {
      scope: acct, path: '/t', body: '{}', leaseSeconds: 60, logger: quietLogger,
      steps: [
        { name: 'one', run: (ctx) => ctx.transaction((client) => write(client, ctx)) },
        { name: 'two', run: async () => {} },
      ],
      finish: async (client, ctx) => (await write(client, ctx), jsonResponse(201, {})),
    });
    assert.equal(r.status, 201);
    // lease 1; step one: BEGIN+fence, its write, checkpoint+COMMIT (3); step two, no write: all four in 1;
    // finish: BEGIN+fence, its write, complete+COMMIT (3)
    assert.equal(calls.length, 8, calls.join('\n'));
  });

  test('a failing step gives the lease back; the retry resumes after the last checkpoint at once', async () => {
    const acct = account();
    const seen = [];
    const boom = new Error('the provider timed out');
    await assert.rejects(go(acct, 'k', [step('one', 'a', seen), step('two', 'a', seen, async () => { throw boom; })]),
      (e) => e === boom);
    // released, not left to run out: the very next attempt is claimed (no 409), with the state of step one
    const r = await go(acct, 'k', [step('one', 'b', seen), step('two', 'b', seen)]);
    assert.equal(r.status, 201);
    assert.deepEqual(seen.map((s) => [s.name, s.holder, s.point, s.state]),
      [['one', 'a', null, {}], ['two', 'a', 'one', { one: 'a' }], ['two', 'b', 'one', { one: 'a' }]]);
    assert.deepEqual((await writes(acct, 'k')).map((w) => [w.step, w.holder]), [['one', 'a'], ['two', 'b']]);
  });

  test("a 5xx from finish is not stored, finish's writes are undone, the retry resumes at the recovery point", async () => {
    const acct = account();
    const seen = [];
    const down = await go(acct, 'k', [step('one', 'a', seen)], {
      async finish(client, ctx) {
        await client.query("INSERT INTO lease_test_writes VALUES ($1, $2, 'finish', 'a', NULL)", [ctx.scope, ctx.key]);
        return problem(503, 'down', 'Service Unavailable');
      },
    });
    assert.equal(down.status, 503);
    const r = await go(acct, 'k', [step('one', 'b', seen)]);
    assert.equal(r.status, 201);
    assert.equal(r.header('Idempotent-Replayed'), undefined);
    assert.deepEqual(JSON.parse(r.body), { done: { one: 'a' }, point: 'one' });
    assert.equal(seen.length, 1, 'step one ran again');
    assert.deepEqual((await writes(acct, 'k')).map((w) => [w.step, w.holder]), [['one', 'a']]);
  });

  test('a stalled holder is taken over; its next checkpoint gets 55000 (LeaseLostError) before its write', async () => {
    const acct = account();
    const seen = [];
    let second;
    let fenced;
    let wrote = false;
    const stalled = await go(acct, 'k', [{
      name: 'one',
      async run(ctx) {
        seen.push(ctx.fencingNumber);
        ctx.stopHeartbeat(); // stalled: the 1 s lease runs out
        // another attempt polls until it takes the key over, and finishes it
        second = await until(() => go(acct, 'k', [step('one', 'second', seen)]));
        try {
          await ctx.transaction(async () => {
            wrote = true;
          });
        } catch (e) {
          fenced = e;
          throw e;
        }
      },
    }], { leaseSeconds: 1 });
    assert.equal(second.status, 201);
    assert.ok(fenced instanceof LeaseLostError, `the stalled holder got ${fenced}`);
    assert.equal(fenced.code, '55000');
    assert.equal(wrote, false, "the stalled holder's step ran its writes");
    assert.equal(stalled.status, 409);
    assert.equal(stalled.header('Retry-After'), '1');
    if (seen[0] !== null) assert.ok(seen[1].fencing > seen[0], `fencing ${seen[1].fencing} after ${seen[0]}`);
    const replay = await go(acct, 'k', []);
    assert.equal(replay.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(JSON.parse(replay.body).done, { one: 'second' });
    assert.deepEqual((await writes(acct, 'k')).map((w) => w.holder), ['second']);
  });

  test('the heartbeat keeps a slow step\'s lease: no takeover during 2.5 leases, the key in flight is 409 Retry-After: 1', async () => {
    const acct = account();
    const probes = [];
    const r = await go(acct, 'k', [{
      name: 'slow',
      async run() {
        // 5 s with a 2 s lease extended every 2/3 s: 1.3 s of margin for a late heartbeat on a busy machine. Every
        // attempt meanwhile must find the lease live; without the heartbeat one would take it over after 2 s.
        const end = Date.now() + 5000;
        while (Date.now() < end) {
          const p = await go(acct, 'k', []);
          probes.push(`${p.status} ${p.header('Retry-After')} ${JSON.parse(p.body).type.split('/').pop()}`);
          await sleep(250);
        }
      },
    }], { leaseSeconds: 2 });
    assert.equal(r.status, 201);
    assert.ok(probes.length >= 5, `${probes.length} probes`);
    assert.deepEqual([...new Set(probes)], ['409 1 idempotency-key-in-progress']);
  });

  test('the heartbeat that finds the lease taken over aborts ctx.signal with LeaseLostError', async () => {
    const acct = account();
    let reason;
    const r = await go(acct, 'k', [{
      name: 'one',
      async run(ctx) {
        // the lease runs out under the holder's feet (as if its heartbeats had been lost), another attempt takes it
        // (again when a heartbeat slipped in between the UPDATE and the takeover and moved the lease on)
        let other;
        for (let i = 0; i < 20 && other?.status !== 201; i++) {
          for (const t of ['idempotency_keys', 'idempotency_keys_partitioned']) {
            if ((await pool.query('SELECT to_regclass($1) AS r', [t])).rows[0].r) {
              await pool.query(`UPDATE ${t} SET lease_until = now() - interval '1 second' WHERE scope = $1 AND key = $2`,
                [ctx.scope, ctx.key]);
            }
          }
          other = await go(acct, 'k', [step('one', 'second', [])]);
        }
        assert.equal(other.status, 201);
        // heartbeats every 200 ms: 10 s is plenty; a heartbeat that never notices leaves `reason` undefined
        reason = await Promise.race([
          new Promise((resolve) => ctx.signal.addEventListener('abort', () => resolve(ctx.signal.reason))),
          sleep(10000, undefined, { ref: false }),
        ]);
      },
    }], { leaseSeconds: 3, heartbeatMs: 200 });
    assert.ok(reason instanceof LeaseLostError, String(reason));
    assert.equal(r.status, 409);
    assert.deepEqual((await writes(acct, 'k')).map((w) => w.holder), ['second']);
  });

  test('a process killed mid-step: the retry resumes at the recovery point and finishes exactly once', async () => {
    const acct = account();
    const child = spawn(process.execPath, [new URL('./lease-child.js', import.meta.url).pathname], {
      env: { ...process.env, LEASE_SCOPE: acct, LEASE_KEY: 'k' }, stdio: ['ignore', 'ignore', 'inherit'],
    });
    const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve(signal || code)));
    try {
      // wait until the child has committed step one and is inside step two
      const deadline = Date.now() + 20000;
      while (!(await writes(acct, 'k')).some((w) => w.step === 'two-started')) {
        assert.ok(Date.now() < deadline, 'the child never reached step two');
        await sleep(50);
      }
    } finally {
      child.kill('SIGKILL');
    }
    assert.equal(await exited, 'SIGKILL');
    const seen = [];
    const r = await until(() => go(acct, 'k', [step('one', 'retry', seen), step('two', 'retry', seen)]));
    assert.equal(r.status, 201);
    assert.deepEqual(seen.map((s) => [s.name, s.point, s.state]), [['two', 'one', { one: 'child' }]]);
    assert.deepEqual(JSON.parse(r.body).done, { one: 'child', two: 'retry' });
    assert.deepEqual((await writes(acct, 'k')).map((w) => [w.step, w.holder]),
      [['one', 'child'], ['two', 'retry'], ['two-started', 'child']]);
    const replay = await go(acct, 'k', []);
    assert.equal(replay.header('Idempotent-Replayed'), 'true');
    assert.ok(replay.body.equals(r.body));
  });
});

describe('runLease on a 1.1 database (no fencing_number column)', { skip }, () => {
  // A database of its own next to IDEM_TEST_DATABASE_URL's, with the extension at 1.1 (1.0 + the 1.0--1.1 update):
  // idem_lease's result has no trailing fencing_number there, and the step API must still work, with null.
  const name = unique('idem_lease11_');
  let admin;
  let pool;
  let why = null;

  before(async () => {
    admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    try {
      await admin.query(`CREATE DATABASE ${name}`);
    } catch (e) {
      why = `cannot create a database: ${e.message}`;
      return;
    }
    const url = new URL(DATABASE_URL);
    url.pathname = `/${name}`;
    pool = new pg.Pool({ connectionString: url.href, max: 4 });
    await pool.query("CREATE EXTENSION idempotency VERSION '1.1'");
  });

  after(async () => {
    await pool?.end();
    if (!why) await admin.query(`DROP DATABASE IF EXISTS ${name}`).catch(() => {});
    await admin?.end();
  });

  test('fencingNumber is null, the steps, the checkpoint and the replay work', async (t) => {
    if (why) return t.skip(why);
    const { rows: [{ v }] } = await pool.query("SELECT extversion AS v FROM pg_extension WHERE extname = 'idempotency'");
    assert.equal(v, '1.1');
    const seen = [];
    const options = {
      path: '/t', body: '{}', leaseSeconds: 5, logger: quietLogger,
      steps: [{ name: 'one', async run(ctx) { seen.push(ctx.fencingNumber); ctx.state.one = 1; } }],
      finish: async (client, ctx) => jsonResponse(201, ctx.state),
    };
    const first = await runLease(pool, 'k', options);
    assert.equal(first.status, 201);
    assert.deepEqual(seen, [null]);
    assert.deepEqual(JSON.parse(first.body), { one: 1 });
    const again = await runLease(pool, 'k', options);
    assert.equal(again.header('Idempotent-Replayed'), 'true');
    assert.ok(again.body.equals(first.body));
  });
});

describe('POST /rides (the service, lease mode) against PostgreSQL', { skip }, () => {
  const run = unique('r');
  let pool;
  let srv;
  let n = 0;
  const account = () => `${run}_${++n}`;
  const ride = (acct, key, body = { amount_cents: 2000, currency: 'USD' }, fault) => post(`${srv.url}/rides`, body,
    { Authorization: `Bearer ${acct}`, 'Idempotency-Key': key, ...(fault ? { 'X-Fault': fault } : {}) });
  const rows = async (acct) => (await pool.query(
    'SELECT r.id, r.charge_id, r.receipt_sent, r.fencing_number, ' +
    '(SELECT count(*)::int FROM provider_charges c WHERE c.account = $1) AS charges, ' +
    '(SELECT count(*)::int FROM receipts m WHERE m.account = $1) AS receipts ' +
    'FROM rides r WHERE r.account = $1', [acct])).rows;

  before(async () => {
    pool = await testPool({ max: 12 });
    srv = await listen(createApp({ pool, faults: true, logger: quietLogger, ridesLeaseSeconds: 1 }));
  });

  after(async () => {
    await srv?.close();
    await pool?.end();
  });

  test('a ride: one charge, one ride, one receipt; the replay is the same bytes', async () => {
    const acct = account();
    const first = await ride(acct, 'k');
    assert.equal(first.status, 201, first.text);
    const { ride_id: id, charge_id: charge } = first.json;
    assert.deepEqual(first.json, { ride_id: id, account: acct, amount_cents: 2000, currency: 'USD', charge_id: charge });
    assert.equal(first.headers.get('location'), `/rides/${id}`);
    const again = await ride(acct, 'k');
    assert.equal(again.status, 201);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(again.text, first.text);
    const [r] = await rows(acct);
    assert.deepEqual([r.id, r.charge_id, r.receipt_sent, r.charges, r.receipts], [String(id), charge, true, 1, 1]);
    const { rows: [{ v }] } = await pool.query("SELECT extversion AS v FROM pg_extension WHERE extname = 'idempotency'");
    if (v !== '1.1') assert.match(r.fencing_number, /^\d+$/, 'the fencing number is written with the ride');
  });

  test('validation 422 is not executed (no lease, no charge); GET is 405 with Allow', async () => {
    const acct = account();
    const bad = await ride(acct, 'k', { amount_cents: 0, currency: 'USD' });
    assert.equal(bad.status, 422);
    assert.match(bad.json.type, /invalid-payment$/);
    assert.equal((await ride(acct, 'k')).status, 201, 'the corrected retry was not claimed afresh');
    const get = await fetch(`${srv.url}/rides`);
    assert.equal(get.status, 405);
    assert.equal(get.headers.get('allow'), 'POST');
  });

  test('provider 503: nothing stored, the lease given back, the retry rides at once', async () => {
    const acct = account();
    const down = await ride(acct, 'k', undefined, 'provider-503');
    assert.equal(down.status, 503);
    assert.match(down.json.type, /provider-unavailable$/);
    assert.deepEqual(await rows(acct), []);
    assert.equal((await ride(acct, 'k')).status, 201);
  });

  test('a stalled holder (stall past its 1 s lease) answers 409 and writes no ride; the takeover rides once', async () => {
    const acct = account();
    const stalled = ride(acct, 'k', undefined, 'stall=6000'); // 5 s of margin for the takeover below
    // poll until the lease is taken over (409 while the stalled holder's lease is live), the first after its claim
    const took = await until(async () => (await sleep(200), ride(acct, 'k')));
    assert.equal(took.status, 201, took.text);
    const s = await stalled;
    assert.equal(s.status, 409, s.text);
    assert.equal(s.headers.get('retry-after'), '1');
    const [r, ...more] = await rows(acct);
    assert.deepEqual(more, []);
    assert.deepEqual([r.id, r.charge_id, r.charges, r.receipts], [String(took.json.ride_id), took.json.charge_id, 1, 1]);
  });
});
