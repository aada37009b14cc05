// Compiled (not run) by test/package.test.js with tsc --noEmit: the declarations in index.d.ts, reached through the
// package's own name and its "exports", type the documented uses and refuse wrong ones.
import { createServer } from 'node:http';
import {
  CapturedResponse, DEFAULT_BODY_LIMIT, HttpProblem, LeaseLostError, admit, errorStatus, fastifyIdempotency, idempotency,
  jsonResponse, koaIdempotency, readBody,
  parseIdempotencyKey, runLease, transactional,
  type IdempotencyHandle, type IdempotencyOptions, type LeasePoolLike, type LeaseStep, type PoolLike,
} from 'idempotency-pg';

declare const pool: PoolLike;

const options: IdempotencyOptions<{ headers: Record<string, string | undefined> }> = {
  pool,
  scope: (req) => {
    const account = req.headers['x-account'];
    if (!account) throw new HttpProblem(401, 'unauthorized', 'Unauthorized');
    return account;
  },
  ttl: '24 hours',
  isolationLevel: 'serializable',
  prepared: 'auto',
  replayHeaders: ['Content-Type', 'Location'],
};
const idem = idempotency(options);
const route = idem(async (req, res) => {
  const handle: IdempotencyHandle = req.idempotency;
  await handle.client.query('INSERT INTO ledger DEFAULT VALUES');
  if (handle.attempt > 0) handle.notExecuted();
  res.statusCode = 201;
  res.end('{}');
});
createServer((req, res) => void route(req, res, () => {}));
const use = idem();
void use;
// store-less per route, and the middleware's answers in Stripe's shape
void idem({ redact: ['/card/number'], storeBody: true }, (req, res) => void res.end(String(req.rawBody.length)));
void idempotency({
  pool,
  renderProblem: (p) => ({
    status: p.status,
    headers: { ...p.headers, 'Stripe-Should-Retry': String(p.status === 409) },
    body: { error: { type: 'idempotency_error', message: p.detail } },
  }),
});
// @ts-expect-error redact takes JSON Pointers as strings
void idem({ redact: [1] }, () => undefined);
void transactional({ pool });
void koaIdempotency({ pool, methods: ['POST'], renderError: (err, ctx) => void [err, ctx] });
void fastifyIdempotency;
const key: string = parseIdempotencyKey('"abc"');
const status: number | null = errorStatus(new Error('x'));
void key;
void status;

// @ts-expect-error the pool is required
idempotency({});
// @ts-expect-error prepared is true, false or 'auto'
idempotency({ pool, prepared: 'sometimes' });

// Lease mode: steps with a typed recovery state, finish in the completing transaction.
declare const leasePool: LeasePoolLike;
type RideState = { charge_id?: string; ride_id?: number };
const charge: LeaseStep<RideState> = {
  name: 'charge_created',
  async run(ctx) {
    const fencing: bigint | null = ctx.fencingNumber;
    const res = await fetch('https://provider.example/charges', { method: 'POST', signal: ctx.signal });
    await ctx.transaction(async (client) => {
      await client.query('INSERT INTO rides (charge_id, fencing_number) VALUES ($1, $2)', [res.status, fencing]);
      ctx.state.charge_id = 'ch_1';
    });
  },
};
void (async () => {
  try {
    const answer = await runLease<RideState>(leasePool, 'key', {
      scope: 'acct', method: 'POST', path: '/rides', body: '{}', leaseSeconds: 30, steps: [charge],
      finish: (client, ctx) => jsonResponse(201, { charge_id: ctx.state.charge_id }, [['Location', '/rides/1']]),
    });
    const status: number = answer.status;
    void status;
  } catch (e) {
    if (e instanceof LeaseLostError) void e.code;
  }
  void runLease(leasePool, 'key', { requestHash: 'ab'.repeat(32), finish: () => jsonResponse(200, {}) });
  // @ts-expect-error finish is required
  void runLease(leasePool, 'key', { path: '/rides', body: '{}' });
  // @ts-expect-error a body goes with a path, not with a requestHash
  void runLease(leasePool, 'key', { requestHash: 'ab'.repeat(32), body: '{}', finish: () => jsonResponse(200, {}) });
})();

// admit(): what every adapter checks before the database, for a framework of your own
declare const incoming: import('node:http').IncomingMessage;
const admitted = admit({ scope: () => 'acct', bodyLimit: DEFAULT_BODY_LIMIT }, {
  scopeArg: incoming, keyHeader: incoming.headers['idempotency-key'], method: 'POST', path: '/p', query: 'a=%2F',
  body: () => readBody(incoming, { bodyLimit: DEFAULT_BODY_LIMIT }, incoming.headers['content-length']),
  contentType: incoming.headers['content-type'] ?? null,
});
void admitted.then((r) => (r instanceof CapturedResponse ? r.status : r.raw.length + (r.contentType ?? '').length +
  (r.query ?? '').length));
