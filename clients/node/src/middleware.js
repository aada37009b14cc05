// Express middleware: claim the Idempotency-Key, run the handler, store its answer, all in one transaction.

import { interceptResponse, sendResponse } from './capture.js';
import { KeyHeaderError, parseIdempotencyKey } from './header.js';
import {
  CapturedResponse,
  HttpProblem,
  PROBLEM_BASE,
  claimResponse,
  parseJsonBody,
  problem,
  storedForm,
} from './responses.js';

// No `name` is ever passed to client.query: node-postgres then uses the unnamed statement, which does not outlive
// the transaction, so this works through PgBouncer in transaction pooling mode.
export const CLAIM_SQL =
  'SELECT c.outcome, c.http_status, c.response_body::text AS response_body, ' +
  'c.response_headers::text AS response_headers ' +
  'FROM idem_claim($1::text, ' +
  "idem_hash(jsonb_build_object('method', $2::text, 'path', $3::text, 'body', $4::jsonb)), " +
  '$5::interval, $6::text) AS c';
export const COMPLETE_SQL = 'SELECT idem_complete($1::text, $2::int, $3::jsonb, $4::jsonb, $5::text) AS stored';

/** SQLSTATEs after which the whole transaction is run again. */
export const RETRYABLE = new Set(['40001', '40P01']);
/** SQLSTATEs of the claim statement that mean the request body is not JSON that PostgreSQL accepts. */
const BAD_BODY = new Set(['22P02', '22P05', '22003']);

const ISOLATION = new Set(['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']);

class BadBody extends Error {}
class TransactionAborted extends Error {}

function sqlstate(err) {
  return err && (err.code || (err.cause && err.cause.code));
}

export function isRetryable(err) {
  return RETRYABLE.has(sqlstate(err));
}

function noop() {}

/** The raw request body: from a body parser that already ran (req.rawBody, a Buffer or string req.body), or read. */
export async function readRawBody(req, limit) {
  if (req.rawBody !== undefined && req.rawBody !== null) return Buffer.from(req.rawBody);
  if (req._body || (req.body !== undefined && req.readableEnded)) {
    const b = req.body;
    if (Buffer.isBuffer(b)) return b;
    if (typeof b === 'string') return Buffer.from(b, 'utf8');
    return Buffer.from(JSON.stringify(b === undefined ? null : b), 'utf8');
  }
  if (req.readableEnded) return Buffer.alloc(0);
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let failed = false;
    req.on('data', (chunk) => {
      if (failed) return;
      size += chunk.length;
      if (size > limit) {
        failed = true;
        reject(new HttpProblem(413, 'request-body-too-large', 'Request body too large',
          `the request body is over ${limit} bytes`));
        req.resume();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => failed || resolve(Buffer.concat(chunks)));
    req.on('error', (err) => failed || ((failed = true), reject(err)));
    req.on('close', () => {
      if (!failed && !req.readableEnded) {
        failed = true;
        reject(new Error('the request was aborted before its body was read'));
      }
    });
  });
}

/**
 * Run Express-style handlers `(req, res, next)` in sequence until the response is ended. Resolves with the
 * captured response once it has ended and every promise a handler returned has settled; rejects when a handler
 * throws, rejects, or calls next(err), or when the chain ends without a response.
 */
function runHandlers(handlers, req, res, attempt) {
  return new Promise((resolve, reject) => {
    let settled = false;
    let pending = 0;
    let captured = null;
    const fail = (err) => {
      if (settled) return;
      settled = true;
      reject(err instanceof Error ? err : new Error(`handler failed: ${String(err)}`));
    };
    const maybeDone = () => {
      if (!settled && captured && pending === 0) {
        settled = true;
        resolve(captured);
      }
    };
    attempt.done.then((c) => {
      captured = c;
      maybeDone();
    });
    let index = 0;
    const next = (err) => {
      if (settled) return;
      if (err !== undefined && err !== null && err !== 'route' && err !== 'router') return fail(err);
      if (index >= handlers.length) return fail(new Error('the handlers ended without a response'));
      const handler = handlers[index++];
      try {
        const result = handler(req, res, next);
        if (result && typeof result.then === 'function') {
          pending++;
          result.then(
            () => {
              pending--;
              maybeDone();
            },
            (e) => fail(e === undefined ? new Error('handler rejected') : e),
          );
        }
      } catch (e) {
        fail(e);
      }
    };
    next();
  });
}

async function rollback(client) {
  try {
    await client.query('ROLLBACK');
    return true;
  } catch {
    return false; // the connection is broken: the pool drops it
  }
}

function makeRunner(options, useClaim) {
  const {
    pool,
    scope = () => '',
    ttl = null,
    maxRetries = 3,
    replayHeaders = null,
    problemBase = PROBLEM_BASE,
    isolationLevel = null,
    requestPath = (req) => (req.originalUrl || req.url || '/').split('?', 1)[0] || '/',
    bodyLimit = 1024 * 1024,
    logger = console,
  } = options || {};
  if (!pool || typeof pool.connect !== 'function') throw new TypeError('idempotency: options.pool (a pg.Pool) is required');
  if (isolationLevel !== null && !ISOLATION.has(String(isolationLevel).toUpperCase())) {
    throw new TypeError(`idempotency: unknown isolationLevel ${isolationLevel}`);
  }
  const beginSql = isolationLevel ? `BEGIN ISOLATION LEVEL ${String(isolationLevel).toUpperCase()}` : 'BEGIN';

  const internalError = (detail) => problem(500, 'internal-error', 'Internal Server Error', detail, [], problemBase);
  const badBody = () =>
    problem(400, 'request-body-not-json', 'Malformed request body', 'the request body is not JSON', [], problemBase);

  // One transaction: BEGIN, claim, handlers, complete, COMMIT. Returns the answer; throws on errors (rolled back).
  async function attemptOnce(client, interceptor, ctx, handlers, req, res, attemptNo) {
    await client.query(beginSql);
    try {
      if (useClaim) {
        let row;
        try {
          ({ rows: [row] } = await client.query(CLAIM_SQL, [ctx.key, req.method, ctx.path, ctx.bodyText, ttl, ctx.scope]));
        } catch (e) {
          if (BAD_BODY.has(sqlstate(e))) throw new BadBody(e.message);
          throw e;
        }
        const early = claimResponse(row, problemBase);
        if (early) {
          await client.query('ROLLBACK'); // replay, mismatch, in_progress: nothing to keep
          return early;
        }
      }
      req.idempotency = { client, key: ctx.key, scope: ctx.scope, attempt: attemptNo };
      req.db = client;
      req.body = ctx.bodyValue;
      req.rawBody = ctx.raw;
      let captured;
      const attempt = interceptor.begin();
      try {
        captured = await runHandlers(handlers, req, res, attempt);
      } finally {
        interceptor.finish();
      }
      if (captured.status >= 500) {
        await client.query('ROLLBACK'); // not cached, the handler's writes undone
        return captured;
      }
      if (useClaim) {
        const stored = storedForm(captured, replayHeaders);
        await client.query(COMPLETE_SQL, [ctx.key, captured.status, stored.body, stored.headers, ctx.scope]);
      }
      const done = await client.query('COMMIT');
      if (done.command !== 'COMMIT') throw new TransactionAborted('the transaction was aborted by an earlier error');
      return captured;
    } catch (e) {
      if (!(await rollback(client))) ctx.broken = e;
      throw e;
    }
  }

  async function handle(handlers, req, res) {
    let scopeValue = '';
    try {
      scopeValue = await scope(req);
      if (scopeValue === undefined || scopeValue === null) scopeValue = '';
    } catch (e) {
      if (e instanceof HttpProblem) return e.response;
      throw e;
    }
    const ctx = { scope: String(scopeValue), key: null, path: requestPath(req), broken: null };
    if (useClaim) {
      try {
        ctx.key = parseIdempotencyKey(req.headers['idempotency-key']);
      } catch (e) {
        if (!(e instanceof KeyHeaderError)) throw e;
        const title = e.missing ? 'Idempotency-Key required' : 'Invalid Idempotency-Key';
        return problem(400, e.slug, title, e.message, [], problemBase);
      }
    }
    try {
      ctx.raw = await readRawBody(req, bodyLimit);
    } catch (e) {
      if (e instanceof HttpProblem) return e.response;
      throw e;
    }
    try {
      ({ text: ctx.bodyText, value: ctx.bodyValue } = parseJsonBody(ctx.raw));
    } catch {
      return badBody();
    }

    let client;
    try {
      client = await pool.connect();
    } catch (e) {
      logger.error('idempotency: cannot connect to the database:', e.message);
      return internalError('the database is unavailable; retry the request');
    }
    client.on('error', noop); // a lost connection also fails the query in progress
    const interceptor = interceptResponse(res);
    try {
      for (let attemptNo = 0; attemptNo <= maxRetries; attemptNo++) {
        try {
          return await attemptOnce(client, interceptor, ctx, handlers, req, res, attemptNo);
        } catch (e) {
          if (e instanceof BadBody) return badBody();
          if (ctx.broken || !isRetryable(e)) {
            if (e instanceof HttpProblem) return e.response; // thrown by the handler: rolled back, not cached
            const code = sqlstate(e);
            if (code) logger.error(`idempotency: request rolled back: SQLSTATE ${code}: ${e.message}`);
            else logger.error('idempotency: request rolled back:', e);
            return internalError(
              code
                ? `database error (SQLSTATE ${code}); the request was rolled back`
                : 'the request failed and was rolled back',
            );
          }
          logger.info?.(`idempotency: ${sqlstate(e)} on attempt ${attemptNo + 1}, retrying`);
        }
      }
      return problem(409, 'transaction-conflict', 'Conflict',
        'the request kept conflicting with concurrent requests; retry it', [['Retry-After', '1']], problemBase);
    } finally {
      interceptor.restore();
      client.removeListener('error', noop);
      client.release(ctx.broken || undefined);
    }
  }

  return function wrap(...handlers) {
    handlers = handlers.flat();
    if (handlers.length === 0 || handlers.some((h) => typeof h !== 'function')) {
      throw new TypeError('idempotency: give one or more handler functions (req, res, next)');
    }
    return async function idempotencyHandler(req, res, next) {
      let answer;
      try {
        answer = await handle(handlers, req, res);
      } catch (e) {
        logger.error('idempotency: request failed:', e);
        answer = internalError('the request failed');
      }
      if (answer instanceof CapturedResponse) sendResponse(res, answer);
      else next(new Error('idempotency: no answer'));
    };
  };
}

/**
 * `idempotency({pool, scope, ...})` returns `wrap(...handlers)`, which makes one Express handler that runs
 * `handlers` at most once per Idempotency-Key (within the scope), in one transaction with the claim and the
 * stored response. The handlers use `req.idempotency.client` (also `req.db`) for their statements.
 *
 * Options: pool (pg.Pool, required); scope(req) -> string or Promise (the authenticated tenant; may throw
 * HttpProblem, e.g. a 401); ttl (interval text, default the server's idempotency.ttl); maxRetries (3, on
 * 40001/40P01); replayHeaders (allow-list of response headers to store; default all but per-connection ones);
 * isolationLevel ('READ COMMITTED' | 'REPEATABLE READ' | 'SERIALIZABLE'); requestPath(req) (the path in the
 * fingerprint; default the URL path without the query); bodyLimit (bytes, 1 MiB); problemBase; logger.
 */
export function idempotency(options) {
  return makeRunner(options, true);
}

/**
 * The same transaction around `handlers` without any Idempotency-Key (no claim, nothing stored): BEGIN, handlers,
 * COMMIT, or ROLLBACK on a 5xx or an error; retried on 40001/40P01. Takes the same options (scope is only passed
 * through as req.idempotency.scope).
 */
export function transactional(options) {
  return makeRunner(options, false);
}
