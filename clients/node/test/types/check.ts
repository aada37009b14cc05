// Compiled (not run) by test/package.test.js with tsc --noEmit: the declarations in index.d.ts, reached through the
// package's own name and its "exports", type the documented uses and refuse wrong ones.
import { createServer } from 'node:http';
import {
  HttpProblem, errorStatus, fastifyIdempotency, idempotency, koaIdempotency, parseIdempotencyKey, transactional,
  type IdempotencyHandle, type IdempotencyOptions, type PoolLike,
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
  batching: 'multi',
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
void transactional({ pool });
void koaIdempotency({ pool, methods: ['POST'], renderError: (err, ctx) => void [err, ctx] });
void fastifyIdempotency;
const key: string = parseIdempotencyKey('"abc"');
const status: number | null = errorStatus(new Error('x'));
void key;
void status;

// @ts-expect-error the pool is required
idempotency({});
// @ts-expect-error batching is one of auto, pipeline, multi, off
idempotency({ pool, batching: 'sometimes' });
