// The request flow of every adapter (Express around a route and as app.use(), Koa, Fastify) against a fake pool:
// the statements (BEGIN + claim, the handler's, complete + COMMIT), nothing sent before COMMIT, the claim's
// answers, and the status committed is the status sent when a handler fails after a write: a 4xx error is stored
// as the framework sent it, a 5xx or an error without a status is rolled back. Then what only one adapter has.
// integration.test.js runs the real thing.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import http from 'node:http';
import express from 'express';
import Koa from 'koa';
import Fastify from 'fastify';
import { HttpProblem, fastifyIdempotency, idempotency, koaIdempotency, transactional } from '../src/index.js';
import { fakePool, listen, pgError, post, quietLogger, steps, withServer } from './helpers.js';

const KEY = { 'Idempotency-Key': '"k1"', 'X-Account': 'acct' };
const httpError = (status, message) => Object.assign(new Error(message), { status, expose: true });
const notRun = () => assert.fail('handler ran');
const STORED = ['BEGIN', 'claim', 'INSERT 1', 'complete', 'COMMIT'];
const ROLLED_BACK = ['BEGIN', 'claim', 'INSERT 1', 'ROLLBACK'];

// Each scenario: the handler (on the adapter's view), then what the client gets and the statements.
const SCENARIOS = [
  {
    name: 'a 4xx error thrown after the insert (a status set first) is stored as the framework sent it',
    run: async (h) => {
      await h.db.query('INSERT 1');
      h.status(201); // a status set, then an error: the error's answer is what counts
      throw httpError(422, 'card declined');
    },
    status: 422, text: /card declined/, steps: STORED,
  },
  {
    name: 'a 5xx error thrown after the insert is rolled back',
    run: async (h) => {
      await h.db.query('INSERT 1');
      h.status(201);
      throw httpError(502, 'provider down');
    },
    status: 502, steps: ROLLED_BACK,
  },
  {
    name: 'an error without a status after the insert is rolled back (500)',
    run: async (h) => {
      await h.db.query('INSERT 1');
      throw new Error('a bug');
    },
    status: 500, steps: ROLLED_BACK,
  },
  {
    name: 'a 503 answered after the insert is rolled back, and answered as it is',
    run: async (h) => {
      await h.db.query('INSERT 1');
      h.answer(503, { down: true });
    },
    status: 503, text: /^\{"down":true\}$/, steps: ROLLED_BACK,
  },
  {
    name: 'notExecuted(): the 422 is sent, rolled back, not stored',
    run: async (h) => {
      h.idem.notExecuted();
      h.answer(422, { error: 'invalid' });
    },
    status: 422, text: /^\{"error":"invalid"\}$/, steps: ['BEGIN', 'claim', 'ROLLBACK'],
  },
  {
    name: 'an error swallowed by the handler still fails the COMMIT: 500',
    // what PostgreSQL answers to COMMIT in an aborted transaction
    script: { query: (sql) => (sql === 'COMMIT' ? { command: 'ROLLBACK', rows: [] } : undefined) },
    run: async (h) => h.answer(201, {}),
    status: 500, steps: ['BEGIN', 'claim', 'complete', 'COMMIT', 'ROLLBACK'],
  },
];

for (const adapter of ['express route', 'express app.use', 'koa', 'fastify']) describe(adapter, () => {
  const served = (pool, handler, fn, options) => withServer(adapter, pool, handler, fn, options);

  test('claimed: BEGIN + claim, the handler, complete + COMMIT, and only then the answer', async () => {
    const events = [];
    const pool = fakePool({
      async query(sql) {
        if (sql === 'COMMIT') await sleep(100).then(() => events.push('COMMIT'));
      },
    });
    await served(pool, async (h) => {
      assert.equal(h.idem.key, 'k1');
      assert.equal(h.idem.scope, 'acct');
      assert.equal(h.idem.attempt, 0);
      assert.equal(h.db, h.idem.client);
      assert.deepEqual(h.body, { a: 1 });
      await h.db.query('INSERT 1');
      h.answer(201, { id: 1 }, { Location: '/p/1' });
    }, async (url) => {
      const r = await post(url, '{"a": 1}', KEY);
      events.push('answer');
      assert.equal(r.status, 201);
      assert.equal(r.text, '{"id":1}');
      assert.equal(r.headers.get('location'), '/p/1');
      assert.equal(r.headers.get('idempotent-replayed'), null);
    });
    assert.deepEqual(events, ['COMMIT', 'answer'], 'nothing sent before COMMIT');
    assert.deepEqual(steps(pool.log), STORED);
    assert.deepEqual(pool.log.map((l) => Boolean(l.queued)), [false, true, false, false, true],
      'BEGIN + claim, complete + COMMIT pipelined');
    // 1.3: idem_claim_request(key, scope, method, path, query, content_type, body bytes, ttl) and
    // idem_complete_request(key, scope, status, content_type, headers, body bytes), named for the connection
    assert.match(pool.log[1].name, /^idem_claim_request_[0-9a-f]{12}$/);
    // the Content-Type goes with the bytes (CONTRACT.md any-body): the claim fingerprints them
    assert.deepEqual(pool.log[1].params, ['k1', 'acct', 'POST', '/p', null, 'application/json', Buffer.from('{"a": 1}'), null]);
    assert.equal(pool.log[3].name, pool.log[1].name.replace('claim', 'complete'));
    const complete = pool.log[3].params;
    assert.deepEqual(complete.slice(0, 4), ['k1', 'acct', 201, 'application/json; charset=utf-8']);
    const headers = Object.fromEntries(Object.entries(JSON.parse(complete[4])).map(([k, v]) => [k.toLowerCase(), v]));
    assert.equal(headers.location, '/p/1');
    assert.equal(headers['content-type'], undefined, 'the other headers, Content-Type apart');
    assert.deepEqual(complete[5], Buffer.from('{"id":1}'), 'the bytes sent');
    assert.deepEqual(pool.released, [undefined]);
  });

  for (const sc of SCENARIOS) {
    test(sc.name, async () => {
      const pool = fakePool(sc.script);
      await served(pool, sc.run, async (url) => {
        const r = await post(url, '{"a": 1}', KEY);
        assert.equal(r.status, sc.status, r.text);
        if (sc.text) assert.match(r.text, sc.text);
        const complete = pool.log.find((l) => l.sql.includes('idem_complete'));
        if (complete && sc.status < 500) {
          assert.equal(complete.params[2], sc.status);
          assert.equal(complete.params[5].toString(), r.text, 'stored as sent');
        }
      });
      assert.deepEqual(steps(pool.log), sc.steps);
    });
  }

  test('replay: the stored answer with Idempotent-Replayed: true from the claim, its ROLLBACK after the answer', async () => {
    let answered;
    const received = new Promise((resolve) => {
      answered = resolve;
    });
    let rolledBack = false;
    const pool = fakePool({
      claim: () => ({ outcome: 'replay', http_status: 201, response_body: '<p>hi</p>',
        response_headers: '{"Content-Type": "text/html", "Location": "/p/1"}' }),
      async query(sql) {
        if (sql !== 'ROLLBACK') return undefined;
        // held until the client has its answer (at most 3 s): an engine that waited for it would answer late
        await Promise.race([received, new Promise((resolve) => setTimeout(resolve, 3000))]);
        rolledBack = true;
        return { command: 'ROLLBACK', rows: [] };
      },
    });
    await served(pool, notRun, async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(rolledBack, false, 'answered before the ROLLBACK came back');
      answered();
      assert.equal(r.status, 201);
      assert.equal(r.text, '<p>hi</p>');
      assert.equal(r.headers.get('content-type'), 'text/html');
      assert.equal(r.headers.get('location'), '/p/1');
      assert.equal(r.headers.get('idempotent-replayed'), 'true');
    });
    assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
  });

  test('in_progress: 409 with Retry-After: 1; mismatch: 422 idempotency-key-reused; rolled back', async () => {
    for (const [outcome, status, type, retryAfter] of [['in_progress', 409, 'idempotency-key-in-progress', '1'],
      ['mismatch', 422, 'idempotency-key-reused', null]]) {
      const pool = fakePool({ claim: () => ({ outcome, http_status: status }) });
      await served(pool, notRun, async (url) => {
        const r = await post(url, '{}', KEY);
        assert.equal(r.status, status);
        assert.equal(r.headers.get('retry-after'), retryAfter);
        assert.equal(r.headers.get('content-type'), 'application/problem+json');
        assert.match(r.json.type, new RegExp(`/${type}$`));
      });
      assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK']);
    }
  });

  test('a missing or invalid key: 400; a scope that throws: its 401; before any database work', async () => {
    const pool = fakePool();
    await served(pool, notRun, async (url) => {
      for (const [body, headers, slug] of [['{}', {}, 'idempotency-key-missing'],
        ['{}', { 'Idempotency-Key': '"unterminated' }, 'idempotency-key-invalid'],
        ['{}', { 'Idempotency-Key': '""' }, 'idempotency-key-invalid'],
        ['{}', { 'Idempotency-Key': 'k1,k2' }, 'idempotency-key-invalid']]) {
        const r = await post(url, body, headers);
        assert.equal(r.status, 400);
        assert.equal(r.headers.get('content-type'), 'application/problem+json');
        assert.match(r.json.type, new RegExp(`/${slug}$`));
      }
    });
    const scope = () => {
      throw new HttpProblem(401, 'unauthorized', 'Unauthorized', 'no', [['WWW-Authenticate', 'Bearer']]);
    };
    await served(pool, notRun, async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(r.status, 401);
      assert.equal(r.headers.get('www-authenticate'), 'Bearer');
    }, { scope });
    assert.equal(pool.connects, 0);
  });

  test('the claim: 22P05 (a body jsonb refuses) 400; 40001 each time 409 after 3 retries; the database unreachable 500', async () => {
    for (const [code, status, claims] of [['22P05', 400, 1], ['40001', 409, 4]]) {
      let n = 0;
      const pool = fakePool({
        claim() {
          n++;
          throw pgError(code);
        },
      });
      await served(pool, notRun, async (url) => {
        const r = await post(url, '{}', KEY);
        assert.equal(r.status, status);
        assert.equal(r.headers.get('retry-after'), status === 409 ? '1' : null);
      });
      assert.equal(n, claims);
    }
    const down = { connect: () => Promise.reject(new Error('ECONNREFUSED')) };
    await served(down, notRun, async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(r.status, 500);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
    });
  });

  test('a database without the 1.3 statements (42883): the attempt runs again with idem_claim/idem_complete, and so does every later request', async () => {
    const pool = fakePool({
      query(sql) {
        if (sql.includes('idem_claim_request')) throw pgError('42883', 'function idem_claim_request(...) does not exist');
      },
    });
    await served(pool, (h) => h.answer(201, { id: 1 }), async (url) => {
      assert.equal((await post(url, '{}', KEY)).status, 201);
      assert.equal((await post(url, '{}', { ...KEY, 'Idempotency-Key': 'k2' })).status, 201);
    });
    assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK', 'BEGIN', 'claim', 'complete', 'COMMIT',
      'BEGIN', 'claim', 'complete', 'COMMIT']);
    const id = pool.log[1].name.slice(-12);
    assert.deepEqual(pool.log.filter((l) => /idem_(claim|complete)\(/.test(l.sql)).map((l) => l.name),
      [`idem_claim_${id}`, `idem_complete_${id}`, `idem_claim_${id}`, `idem_complete_${id}`]);
  });

  test("a pooler that does not keep named statements (26000, 42P05 at the claim): prepared: 'auto' goes on unnamed; false never names", async () => {
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
      await served(pool, (h) => h.answer(201, { id: 1 }), async (url) => {
        assert.equal((await post(url, '{}', KEY)).status, 201);
      });
      assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK', 'BEGIN', 'claim', 'complete', 'COMMIT']);
      assert.equal(pool.log.map((l) => l.name).filter(Boolean).length, 1, 'named once, then never');
    }
    const pool = fakePool();
    await served(pool, (h) => h.answer(201, { id: 1 }), async (url) => {
      assert.equal((await post(url, '{}', KEY)).status, 201);
    }, { prepared: false });
    assert.deepEqual(pool.log.map((l) => l.name).filter(Boolean), []);
  });
});

// ---- Express only: what its handlers, next() and res give

/** An Express app with `mount(app, idem)` and the app's error handler, served for fn(url). */
async function withApp(pool, mount, fn, options = {}) {
  const app = express();
  mount(app, idempotency({ pool, logger: quietLogger, ...options }));
  // eslint-disable-next-line no-unused-vars
  app.use((err, req, res, next) => res.status(err.status || 500).json({ error: err.message }));
  const srv = await listen(app);
  try {
    await fn(`${srv.url}/p`);
  } finally {
    await srv.close();
  }
}

test('express: write() chunks, writeHead() and a streamed body are captured whole', async () => {
  const pool = fakePool();
  await withApp(pool, (app, idem) => app.post('/p', idem((req, res) => {
    res.writeHead(202, { 'Content-Type': 'text/plain', 'X-A': '1' });
    res.write('hel');
    setTimeout(() => res.end('lo'), 10);
  })), async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 202);
    assert.equal(r.text, 'hello');
    assert.equal(r.headers.get('x-a'), '1');
  });
  const complete = pool.log.find((l) => l.sql.includes('idem_complete')).params;
  assert.deepEqual(complete.slice(2, 5), [202, 'text/plain', '{"X-A":"1"}']);
  assert.deepEqual(complete[5], Buffer.from('hello'), 'any body, stored as its bytes');
});

test('express: a chain of handlers with next(); a chain that calls next() at its end hands on to the next route, in the same transaction; app.use lets GET through', async () => {
  const pool = fakePool();
  await withApp(pool, (app, idem) => {
    app.get('/p', (req, res) => res.json({ ok: true }));
    app.post('/p', idem((req, res, next) => {
      req.seen = 'first';
      next();
    }, (req, res, next) => next()));
    app.post('/p', async (req, res) => {
      await req.db.query('INSERT 2');
      res.status(201).json({ seen: req.seen });
    });
  }, async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 201);
    assert.deepEqual(r.json, { seen: 'first' });
    assert.equal((await fetch(url)).status, 200);
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'INSERT 2', 'complete', 'COMMIT']);
  await withApp(pool, (app, idem) => {
    app.use(idem());
    app.get('/p', (req, res) => res.json({ ok: true }));
  }, async (url) => assert.equal((await fetch(url)).status, 200, 'GET passes through untouched'));
});

test('express: a handler that throws (sync or async) or calls next(err) without a status: ROLLBACK, 500 problem+json; next(err) with a 502 in app.use: rolled back', async () => {
  const handlers = [
    () => {
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
    await withApp(pool, (app, idem) => app.post('/p', idem(h)), async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(r.status, 500);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
      assert.match(r.json.type, /internal-error$/);
    });
    assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'ROLLBACK'], String(h));
  }
  const pool = fakePool();
  await withApp(pool, (app, idem) => {
    app.use(idem());
    app.post('/p', (req, res, next) => req.db.query('INSERT 1').then(() => next(httpError(502, 'provider down'))));
  }, async (url) => assert.equal((await post(url, '{}', KEY)).status, 502));
  assert.deepEqual(steps(pool.log), ROLLED_BACK);
});

test('express: a thrown HttpProblem is answered as it is: a 4xx stored (the status sent), a 5xx rolled back', async () => {
  for (const [status, expected] of [[429, ['BEGIN', 'claim', 'complete', 'COMMIT']], [503, ['BEGIN', 'claim', 'ROLLBACK']]]) {
    const pool = fakePool();
    await withApp(pool, (app, idem) => app.post('/p', idem(() => {
      throw new HttpProblem(status, 'slow-down', 'Slow down');
    })), async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(r.status, status);
      assert.equal(r.headers.get('content-type'), 'application/problem+json');
    });
    assert.deepEqual(steps(pool.log), expected);
  }
});

test('express: a database error in the handler: ROLLBACK, 500 with the SQLSTATE', async () => {
  const pool = fakePool({
    query(sql) {
      if (sql === 'SELECT 1/0') throw pgError('22012', 'division by zero');
    },
  });
  await withApp(pool, (app, idem) => app.post('/p', idem(async (req) => req.db.query('SELECT 1/0'))), async (url) => {
    const r = await post(url, '{}', KEY);
    assert.equal(r.status, 500);
    assert.match(r.json.detail, /22012/);
  });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'claim', 'SELECT 1/0', 'ROLLBACK']);
});

test('express: 40001 / 40P01 in idem(handler) runs the whole transaction again', async () => {
  let calls = 0;
  const pool = fakePool();
  await withApp(pool, (app, idem) => app.post('/p', idem(async (req, res) => {
    calls++;
    res.set('X-Attempt', String(req.idempotency.attempt));
    if (req.idempotency.attempt === 0) throw pgError('40001', 'could not serialize');
    if (req.idempotency.attempt === 1) throw pgError('40P01', 'deadlock');
    res.status(201).json({ attempt: req.idempotency.attempt });
  })), async (url) => {
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

test('express: 40001 at COMMIT: idem(handler) runs it again; after a downstream route (app.use) it cannot: rolled back, 409', async () => {
  for (const [mount, status, expected] of [
    [(app, idem) => app.post('/p', idem((req, res) => res.status(200).json({}))), 200,
      ['BEGIN', 'claim', 'complete', 'COMMIT', 'ROLLBACK', 'BEGIN', 'claim', 'complete', 'COMMIT']],
    [(app, idem) => app.use(idem()).post('/p', (req, res) => res.status(201).json({})), 409,
      ['BEGIN', 'claim', 'complete', 'COMMIT', 'ROLLBACK']],
  ]) {
    let commits = 0;
    const pool = fakePool({
      query(sql) {
        if (sql === 'COMMIT' && ++commits === 1) throw pgError('40001');
      },
    });
    await withApp(pool, mount, async (url) => {
      const r = await post(url, '{}', KEY);
      assert.equal(r.status, status);
      if (status === 409) assert.equal(r.headers.get('retry-after'), '1');
    });
    assert.deepEqual(steps(pool.log), expected);
  }
});

test('express: isolationLevel and ttl options; a body parsed by express.json() is fingerprinted from its JSON', async () => {
  const pool = fakePool();
  await withApp(pool, (app, idem) => app.use(express.json()).post('/p', idem((req, res) => res.json(req.body))),
    async (url) => assert.deepEqual((await post(url, '{"b": 2, "a": 1}', KEY)).json, { b: 2, a: 1 }),
    { isolationLevel: 'serializable', ttl: '1 hour' });
  assert.equal(pool.log[0].sql, 'BEGIN ISOLATION LEVEL SERIALIZABLE');
  assert.equal(pool.log[1].params[7], '1 hour');
  assert.deepEqual(pool.log[1].params[6], Buffer.from('{"b":2,"a":1}'));
  assert.throws(() => idempotency({ pool, isolationLevel: 'chaos' }), /isolationLevel/);
  assert.throws(() => idempotency({ pool, prepared: 'sometimes' }), /prepared/);
  assert.throws(() => idempotency({}), /pool/);
});

test('express: transactional(): BEGIN, handler, COMMIT without a key', async () => {
  const pool = fakePool();
  const tx = transactional({ pool, logger: quietLogger });
  await withApp(pool, (app) => app.post('/p', tx((req, res) => res.status(201).json({ k: req.idempotency.key }))),
    async (url) => {
      const r = await post(url, '{}');
      assert.equal(r.status, 201);
      assert.deepEqual(r.json, { k: null });
    });
  assert.deepEqual(steps(pool.log), ['BEGIN', 'COMMIT']);
});

test('express: without a pipelined client, the same named statements, one round trip each', async () => {
  const pool = fakePool({ pipeline: false });
  await withApp(pool, (app, idem) => app.post('/p', idem(async (req, res) => {
    await req.db.query('INSERT 1');
    res.status(201).json({});
  })), async (url) => assert.equal((await post(url, '{}', KEY)).status, 201));
  assert.deepEqual(steps(pool.log), STORED);
  assert.deepEqual(pool.log.filter((l) => l.queued), [], 'each statement after the answer to the one before');
  assert.match(pool.log[1].name, /^idem_claim_request_/);
  assert.match(pool.log[3].name, /^idem_complete_request_/);
});

test('fastify: routes without config.idempotency are not touched', async () => {
  const pool = fakePool();
  await withServer('fastify', pool, notRun, async (url) => {
    const r = await post(url.replace(/\/p$/, '/open'), '{}');
    assert.equal(r.status, 200);
    assert.deepEqual(r.json, { open: true });
  });
  assert.deepEqual(pool.log, []);
});

// One request line, one fingerprint (CONTRACT.md, idem_fingerprint): the path is the request target up to its
// first '?' and the query what follows it, both as sent: not decoded (%2F, %20, %41 stay), not normalised (dot
// segments, duplicate slashes, case), whatever a framework's routing made of them (a mount prefix stripped, a
// rewritten URL, a '#' that url.parse() takes for a fragment). A trailing '?' (an empty query) is no query: NULL,
// as for a target without '?' (idem_fingerprint hashes NULL and '' alike).
const TARGETS = [
  ['/api/a%2Fb', '/api/a%2Fb', null],
  ['/api/a%20b', '/api/a%20b', null],
  ['/api/%41b', '/api/%41b', null],
  ['/api/p?', '/api/p', null],
  ['/api/p?a=%2F&b=%20c+d&%41=%3f&e', '/api/p', 'a=%2F&b=%20c+d&%41=%3f&e'],
  ['/api/p?x?y=1', '/api/p', 'x?y=1'],
  ['/api/P/./q/../r', '/api/P/./q/../r', null],
  ['/api//p;v=1', '/api//p;v=1', null],
  ['/api/p#f?x=1', '/api/p#f', 'x=1'],
  ["/api/p'x", "/api/p'x", null],
];

/** Send POST `target` exactly as written (fetch would normalise it) and resolve with the status. */
function postRaw(base, target) {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request({ hostname, port, method: 'POST', path: target,
      headers: { ...KEY, 'Content-Type': 'application/json', Connection: 'close' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('error', reject);
    req.end('{}');
  });
}

// Each app protects every path under /api, mounted the way the framework strips or rewrites the prefix.
const MOUNTED = {
  'express app.use(prefix, idem(handler))': (pool) => {
    const app = express();
    app.use('/api', idempotency({ pool, logger: quietLogger })((req, res) => res.status(201).json({ url: req.url })));
    return listen(app);
  },
  'express app.use(idem()) in a router': (pool) => {
    const app = express();
    const router = express.Router();
    router.use(idempotency({ pool, logger: quietLogger })());
    router.use((req, res) => res.status(201).json({}));
    app.use('/api', router);
    return listen(app);
  },
  'koa (behind a mount that strips the prefix)': (pool) => {
    const app = new Koa();
    app.silent = true;
    app.use((ctx, next) => {
      ctx.path = ctx.path.slice('/api'.length) || '/'; // what koa-mount does
      return next();
    });
    app.use(koaIdempotency({ pool, logger: quietLogger }));
    app.use((ctx) => {
      ctx.status = 201;
      ctx.body = {};
    });
    return listen(app.callback());
  },
  'fastify (rewriteUrl strips the prefix)': async (pool) => {
    const app = Fastify({ rewriteUrl: (req) => req.url.slice('/api'.length) || '/' });
    await app.register(fastifyIdempotency, { pool, logger: quietLogger });
    app.post('/*', { config: { idempotency: true } }, async (request, reply) => reply.code(201).send({}));
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
  },
};

for (const [name, make] of Object.entries(MOUNTED)) {
  test(`${name}: the fingerprint's path and query are the request line's, undecoded`, async () => {
    const pool = fakePool();
    const srv = await make(pool);
    try {
      for (const [target, path, query] of TARGETS) {
        pool.log.length = 0;
        assert.equal(await postRaw(srv.url, target), 201, target);
        const claim = pool.log.find((l) => l.sql.includes('idem_claim_request'));
        assert.deepEqual(claim.params.slice(2, 5), ['POST', path, query], target);
      }
    } finally {
      await srv.close();
    }
  });
}
