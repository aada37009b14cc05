// The middleware's transaction flow against a fake pool (no database needed).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { HttpProblem, idempotency, transactional } from '../src/index.js';
import { fakePool, listen, pgError, post, quietLogger, steps } from './helpers.js';

async function withApp(pool, handlers, fn, options = {}) {
  const app = express();
  const idem = idempotency({ pool, logger: quietLogger, scope: (req) => req.headers['x-account'] || '', ...options });
  app.post('/p', idem(...handlers));
  const srv = await listen(app);
  try {
    await fn(srv.url + '/p');
  } finally {
    await srv.close();
  }
}

const KEY = { 'Idempotency-Key': '"k1"', 'X-Account': 'acct' };

test('claimed: BEGIN, claim, handler, complete, COMMIT, and only then the answer', async () => {
  let resRef;
  const pool = fakePool({
    query(sql) {
      if (sql === 'COMMIT') {
        assert.equal(resRef.headersSent, false, 'nothing sent before COMMIT');
        pool.sawCommit = true;
      }
    },
  });
  const handler = async (req, res) => {
    resRef = res;
    assert.equal(req.idempotency.key, 'k1');
    assert.equal(req.idempotency.scope, 'acct');
    assert.equal(req.idempotency.attempt, 0);
    assert.equal(req.db, req.idempotency.client);
    assert.deepEqual(req.body, { a: 1 });
    await req.db.query('INSERT 1');
    res.status(201).set('Location', '/p/1').json({ id: 1 });
  };
  await withApp(pool, [handler], async (url) => {
    const r = await post(url, '{"a": 1}', KEY);
    assert.equal(r.status, 201);
    assert.deepEqual(r.json, { id: 1 });
    assert.equal(r.headers.get('location'), '/p/1');
    assert.equal(r.headers.get('idempotent-replayed'), null);
  });
  assert.ok(pool.sawCommit);
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT']);
  assert.deepEqual(pool.log.map((l) => Boolean(l.queued)), [false, true, false, false, true], 'BEGIN + claim, complete + COMMIT pipelined');
  // 1.3: idem_claim_request(key, scope, method, path, query, content_type, body bytes, ttl) and
  // idem_complete_request(key, scope, status, content_type, headers, body bytes), named for the connection
  assert.match(pool.log[1].name, /^idem_claim_request_[0-9a-f]{12}$/);
  assert.deepEqual(pool.log[1].params, ['k1', 'acct', 'POST', '/p', null, null, Buffer.from('{"a": 1}'), null]);
  assert.equal(pool.log[3].name, pool.log[1].name.replace('claim', 'complete'));
  const complete = pool.log[3].params;
  assert.deepEqual(complete.slice(0, 4), ['k1', 'acct', 201, 'application/json; charset=utf-8']);
  assert.equal(JSON.parse(complete[4]).Location, '/p/1');
  assert.equal(JSON.parse(complete[4])['Content-Type'], undefined, 'the other headers, Content-Type apart');
  assert.deepEqual(complete[5], Buffer.from('{"id":1}'), 'the bytes sent');
  assert.deepEqual(pool.released, [undefined]);
});

test('write() chunks, writeHead() and a streamed body are captured whole', async () => {
  const pool = fakePool();
  const handler = (req, res) => {
    res.writeHead(202, { 'Content-Type': 'text/plain', 'X-A': '1' });
    res.write('hel');
    setTimeout(() => res.end('lo'), 10);
  };
  await withApp(pool, [handler], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 202);
    assert.equal(r.text, 'hello');
    assert.equal(r.headers.get('x-a'), '1');
  });
  const complete = pool.log.find((l) => l.sql.includes('idem_complete')).params;
  assert.deepEqual(complete.slice(2, 5), [202, 'text/plain', '{"X-A":"1"}']);
  assert.deepEqual(complete[5], Buffer.from('hello'), 'any body, stored as its bytes');
});

test('a chain of handlers with next()', async () => {
  const pool = fakePool();
  const first = (req, res, next) => {
    req.seen = 'first';
    next();
  };
  const second = (req, res) => res.status(200).json({ seen: req.seen });
  await withApp(pool, [first, second], async (url) => {
    assert.deepEqual((await post(url, '{}', KEY)).json, { seen: 'first' });
  });
});

test('replay: ROLLBACK, the stored answer with Idempotent-Replayed: true, handler not run', async () => {
  const pool = fakePool({
    claim: () => ({
      outcome: 'replay',
      http_status: 201,
      response_body: '{"id": 1}',
      response_headers: '{"Content-Type": "application/json", "Location": "/p/1"}',
    }),
  });
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 201);
    assert.equal(r.text, '{"id": 1}');
    assert.equal(r.headers.get('idempotent-replayed'), 'true');
    assert.equal(r.headers.get('location'), '/p/1');
    assert.equal(r.headers.get('content-type'), 'application/json');
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
});

test('in_progress: 409 with Retry-After: 1', async () => {
  const pool = fakePool({ claim: () => ({ outcome: 'in_progress', http_status: 409 }) });
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 409);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal(r.headers.get('content-type'), 'application/problem+json');
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
});

test('mismatch: 422 idempotency-key-reused', async () => {
  const pool = fakePool({ claim: () => ({ outcome: 'mismatch', http_status: 422 }) });
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 422);
    assert.match(r.json.type, /idempotency-key-reused$/);
  });
});

test('missing, invalid key and a body that is not JSON: 400 before any database work', async () => {
  const pool = fakePool();
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    let r = await post(url, '{}', {});
    assert.equal(r.status, 400);
    assert.equal(r.headers.get('content-type'), 'application/problem+json');
    assert.match(r.json.type, /idempotency-key-missing$/);
    r = await post(url, '{}', { 'Idempotency-Key': '"unterminated' });
    assert.equal(r.status, 400);
    assert.match(r.json.type, /idempotency-key-invalid$/);
    r = await post(url, '{}', { 'Idempotency-Key': '""' });
    assert.match(r.json.type, /idempotency-key-invalid$/);
    r = await post(url, '{not json', KEY);
    assert.equal(r.status, 400);
    assert.match(r.json.type, /request-body-not-json$/);
  });
  assert.equal(pool.connects, 0);
});

test('a scope function can answer a problem first (401)', async () => {
  const pool = fakePool();
  const scope = () => {
    throw new HttpProblem(401, 'unauthorized', 'Unauthorized', 'no', [['WWW-Authenticate', 'Bearer']]);
  };
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '{}', {});
    assert.equal(r.status, 401);
    assert.equal(r.headers.get('www-authenticate'), 'Bearer');
  }, { scope });
  assert.equal(pool.connects, 0);
});

test('handler 5xx: ROLLBACK, not completed, the 5xx answered', async () => {
  const pool = fakePool();
  await withApp(pool, [(req, res) => res.status(503).json({ down: true })], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 503);
    assert.deepEqual(r.json, { down: true });
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
});

test('handler throws (sync or async) or calls next(err): ROLLBACK, 500 problem+json', async () => {
  const handlers = [
    () => {
      throw new Error('boom');
    },
    async (req) => {
      await req.db.query('INSERT 1');
      throw new Error('boom');
    },
    (req, res, next) => next(new Error('boom')),
    async (req, res) => {
      res.status(201).json({}); // answered, then failed: still rolled back
      throw new Error('late boom');
    },
  ];
  for (const h of handlers) {
    const pool = fakePool();
    await withApp(pool, [h], async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(r.status, 500);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
      assert.match(r.json.type, /internal-error$/);
    });
    assert.ok(!steps(pool.log).includes('complete'), String(h));
    assert.ok(!steps(pool.log).includes('COMMIT'), String(h));
    assert.equal(steps(pool.log).at(-1), 'ROLLBACK');
  }
});

test('a thrown HttpProblem is answered as it is: a 4xx stored (the status sent), a 5xx rolled back', async () => {
  for (const [status, expected] of [[429, ['BEGIN', 'claim', 'complete', 'COMMIT']], [503, ['BEGIN', 'claim', 'ROLLBACK']]]) {
    const pool = fakePool();
    const h = () => {
      throw new HttpProblem(status, 'slow-down', 'Slow down');
    };
    await withApp(pool, [h], async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(r.status, status);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
    });
    assert.deepEqual(steps(pool.log), expected);
  }
});

test('a database error in the handler: ROLLBACK, 500 with the SQLSTATE', async () => {
  const pool = fakePool({
    query(sql) {
      if (sql === 'SELECT 1/0') throw pgError('22012', 'division by zero');
    },
  });
  await withApp(pool, [async (req) => req.db.query('SELECT 1/0')], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 500);
    assert.match(r.json.detail, /22012/);
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'SELECT 1/0', 'ROLLBACK']);
});

test('an error swallowed by the handler still fails the COMMIT: 500', async () => {
  const pool = fakePool({
    query(sql) {
      if (sql === 'COMMIT') return { command: 'ROLLBACK', rows: [] }; // what PostgreSQL answers in an aborted tx
    },
  });
  await withApp(pool, [(req, res) => res.status(201).json({})], async (url) => {
    assert.equal((await post(url, '{}', KEY)).status, 500);
  });
});

test('40001 / 40P01: the whole transaction is run again', async () => {
  let calls = 0;
  const pool = fakePool();
  const h = async (req, res) => {
    calls++;
    res.set('X-Attempt', String(req.idempotency.attempt));
    if (req.idempotency.attempt === 0) throw pgError('40001', 'could not serialize');
    if (req.idempotency.attempt === 1) throw pgError('40P01', 'deadlock');
    res.status(201).json({ attempt: req.idempotency.attempt });
  };
  await withApp(pool, [h], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 201);
    assert.deepEqual(r.json, { attempt: 2 });
    assert.equal(r.headers.get('x-attempt'), '2');
  });
  assert.equal(calls, 3);
  assert.deepEqual(steps(pool.log), [
    'BEGIN', 'claim', 'ROLLBACK', 'BEGIN', 'claim', 'ROLLBACK', 'BEGIN', 'claim', 'complete', 'COMMIT',
  ]);
});

test('40001 from the claim or the COMMIT is retried too; after 3 retries: 409', async () => {
  let claims = 0;
  const pool = fakePool({
    claim() {
      claims++;
      throw pgError('40001');
    },
  });
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 409);
    assert.equal(r.headers.get('retry-after'), '1');
  });
  assert.equal(claims, 4); // the first run and 3 retries

  let commits = 0;
  const pool2 = fakePool({
    query(sql) {
      if (sql === 'COMMIT' && ++commits === 1) throw pgError('40001');
    },
  });
  await withApp(pool2, [(req, res) => res.status(200).json({})], async (url) => {
    assert.equal((await post(url, '{}', KEY)).status, 200);
  });
  assert.equal(commits, 2);
});

test('a body the database refuses as jsonb (22P02 from the claim): 400', async () => {
  const pool = fakePool({
    claim() {
      throw pgError('22P05', 'unsupported Unicode escape sequence');
    },
  });
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '"\\u0000"', KEY);
    assert.equal(r.status, 400);
    assert.match(r.json.type, /request-body-not-json$/);
  });
});

test('the database unreachable: 500 problem+json', async () => {
  const pool = {
    async connect() {
      throw new Error('ECONNREFUSED');
    },
  };
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 500);
    assert.equal(r.headers.get('content-type'), 'application/problem+json');
  });
});

test('a handler chain that calls next() hands the request on to the next route, in the same transaction', async () => {
  const pool = fakePool();
  const app = express();
  const idem = idempotency({ pool, logger: quietLogger });
  app.post('/p', idem((req, res, next) => next()));
  app.post('/p', async (req, res) => {
    await req.db.query('INSERT 2');
    res.status(201).json({ later: true });
  });
  const srv = await listen(app);
  try {
    const r = await post(srv.url + '/p', '{}', KEY);
    assert.equal(r.status, 201);
    assert.deepEqual(r.json, { later: true });
  } finally {
    await srv.close();
  }
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'INSERT 2', 'complete', 'COMMIT']);
});

test('isolationLevel and ttl options', async () => {
  const pool = fakePool();
  await withApp(pool, [(req, res) => res.json({})], async (url) => {
    await post(url, '{}', KEY);
  }, { isolationLevel: 'serializable', ttl: '1 hour' });
  assert.equal(pool.log[0].sql, 'BEGIN ISOLATION LEVEL SERIALIZABLE');
  assert.equal(pool.log[1].params[7], '1 hour');
  assert.throws(() => idempotency({ pool, isolationLevel: 'chaos' }), /isolationLevel/);
  assert.throws(() => idempotency({}), /pool/);
});

test('a body already parsed by express.json() is fingerprinted from its JSON', async () => {
  const pool = fakePool();
  const app = express();
  app.use(express.json());
  app.post('/p', idempotency({ pool, logger: quietLogger })((req, res) => res.json(req.body)));
  const srv = await listen(app);
  try {
    const r = await post(srv.url + '/p', '{"b": 2, "a": 1}', KEY);
    assert.deepEqual(r.json, { b: 2, a: 1 });
  } finally {
    await srv.close();
  }
  assert.deepEqual(pool.log[1].params[6], Buffer.from('{"b":2,"a":1}'));
});

test('transactional(): BEGIN, handler, COMMIT without a key', async () => {
  const pool = fakePool();
  const app = express();
  app.post('/u', transactional({ pool, logger: quietLogger })((req, res) => res.status(201).json({ k: req.idempotency.key })));
  const srv = await listen(app);
  try {
    const r = await post(srv.url + '/u', '{}');
    assert.equal(r.status, 201);
    assert.deepEqual(r.json, { k: null });
  } finally {
    await srv.close();
  }
  assert.deepEqual(steps(pool.log), ['BEGIN', 'COMMIT']);
});

test('a database without the 1.3 statements (42883): the attempt runs again with idem_claim/idem_complete, and so does every later request', async () => {
  const pool = fakePool({
    query(sql) {
      if (sql.includes('idem_claim_request')) throw pgError('42883', 'function idem_claim_request(...) does not exist');
    },
  });
  await withApp(pool, [(req, res) => res.status(201).json({ id: 1 })], async (url) => {
    assert.equal((await post(url, '{}', KEY)).status, 201);
    assert.equal((await post(url, '{}', { ...KEY, 'Idempotency-Key': 'k2' })).status, 201);
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK', 'BEGIN', 'claim', 'complete', 'COMMIT',
    'BEGIN', 'claim', 'complete', 'COMMIT']);
  const id = pool.log[1].name.slice(-12);
  assert.deepEqual(pool.log.filter((l) => /idem_(claim|complete)\(/.test(l.sql)).map((l) => l.name),
    [`idem_claim_${id}`, `idem_complete_${id}`, `idem_claim_${id}`, `idem_complete_${id}`]);
});

test("a pooler that does not keep named statements (26000, 42P05): prepared: 'auto' goes on unnamed; false never names", async () => {
  for (const code of ['26000', '42P05']) {
    let failed = false;
    const pool = fakePool({
      query(sql, params, log) {
        if (log.at(-1).name && !failed) {
          failed = true;
          throw pgError(code, `prepared statement "${log.at(-1).name}" does not exist`);
        }
      },
    });
    await withApp(pool, [(req, res) => res.status(201).json({ id: 1 })], async (url) => {
      assert.equal((await post(url, '{}', KEY)).status, 201);
    });
    assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK', 'BEGIN', 'claim', 'complete', 'COMMIT']);
    assert.equal(pool.log.map((l) => l.name).filter(Boolean).length, 1, 'named once, then never');
  }
  const pool = fakePool();
  await withApp(pool, [(req, res) => res.status(201).json({ id: 1 })], async (url) => {
    assert.equal((await post(url, '{}', KEY)).status, 201);
  }, { prepared: false });
  assert.deepEqual(pool.log.map((l) => l.name).filter(Boolean), []);
});

test('a replay is answered from the claim; its ROLLBACK follows the answer', async () => {
  let answered;
  const received = new Promise((resolve) => {
    answered = resolve;
  });
  let rolledBack = false;
  const pool = fakePool({
    claim: () => ({ outcome: 'replay', http_status: 201, response_body: '<p>hi</p>', response_headers: '{"X-A": "1"}' }),
    async query(sql) {
      if (sql !== 'ROLLBACK') return undefined;
      // held until the client has its answer (at most 3 s): an engine that waited for it would answer late
      await Promise.race([received, new Promise((resolve) => setTimeout(resolve, 3000))]);
      rolledBack = true;
      return { command: 'ROLLBACK', rows: [] };
    },
  });
  await withApp(pool, [() => assert.fail('handler ran')], async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(rolledBack, false, 'answered before the ROLLBACK came back');
    answered();
    assert.equal(r.status, 201);
    assert.equal(r.text, '<p>hi</p>');
    assert.equal(r.headers.get('x-a'), '1');
    assert.equal(r.headers.get('idempotent-replayed'), 'true');
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
});
