// Express (and any node:http `(req, res, next)` stack, e.g. NestJS on Express): claim the Idempotency-Key, run the
// handlers, store their answer, all in one transaction.
//
// Two ways to mount it:
// - `app.post('/payments', idem(handler, ...))`: the middleware runs the handlers itself, so it knows when they are
//   done, sees every error they throw or pass to next(err), and runs them again on 40001/40P01;
// - `app.use(idem())` (or `app.post('/payments', idem(), handler)`): a middleware before the routes. It claims and
//   calls next(); whatever the rest of the app writes is held back until it ends (a 40001 there cannot be run
//   again: 409 Retry-After).
// The status committed is the status sent: the response stays held back through Express's own error handlers, so
// an error with an HTTP status (http-errors' `status`/`statusCode`, e.g. a thrown 422) is answered by the app's
// error handlers and that answer is what is stored (a 4xx) or rolled back (a 5xx). An error without a status (a
// bug, a database error) is rolled back and answered 500 problem+json.

import { interceptResponse, sendResponse } from './capture.js';
import { BadBody, begin, commit, connect, isRetryable, rollback, sqlstate } from './engine.js';
import { admit, conflict, badBody, frontOptions, internalError, readStream } from './request.js';
import { CapturedResponse, HttpProblem } from './responses.js';

export { CLAIM_SQL, COMPLETE_SQL, RETRYABLE, isRetryable } from './engine.js';

/** Methods a bare `app.use(idem())` protects by default; other requests pass through untouched. */
const DEFAULT_USE_METHODS = ['POST', 'PATCH'];

/** The raw request body: from a body parser that already ran (req.rawBody, a Buffer or string req.body), or read. */
export async function readRawBody(req, cfgOrLimit) {
  const cfg = typeof cfgOrLimit === 'number' ? { bodyLimit: cfgOrLimit } : cfgOrLimit;
  if (req.rawBody !== undefined && req.rawBody !== null) return Buffer.from(req.rawBody);
  if (req._body || (req.body !== undefined && req.readableEnded)) {
    const b = req.body;
    if (Buffer.isBuffer(b)) return b;
    if (typeof b === 'string') return Buffer.from(b, 'utf8');
    return Buffer.from(JSON.stringify(b === undefined ? null : b), 'utf8');
  }
  return readStream(req, cfg);
}

class ClientGone extends Error {}

/** The HTTP status an error carries (http-errors and Express's convention), or null. */
export function errorStatus(err) {
  const status = err && (err.status ?? err.statusCode);
  return Number.isInteger(status) && status >= 400 && status <= 599 ? status : null;
}

/**
 * Run Express-style handlers `(req, res, next)` in sequence. Resolves with the captured response once it has ended
 * and every promise a handler returned has settled; rejects when a handler throws, rejects, or calls next(err), or
 * when the chain ends without a response and there is no `outerNext` to go on with. With `outerNext`, the last
 * handler's next() hands the request on to the rest of the app (attempt.downstream is then set).
 */
function runChain(handlers, req, res, attempt, outerNext) {
  return new Promise((resolve, reject) => {
    let settled = false;
    let pending = 0;
    let captured = null;
    const fail = (err) => {
      if (settled) return;
      if (outerNext && !attempt.handedError && errorStatus(err) !== null && !(err instanceof HttpProblem)) {
        // The framework's own error boundary answers it: Express's error handlers write into the held-back
        // response, and what they write is what is stored (4xx) or rolled back (5xx).
        attempt.handedError = true;
        attempt.downstream = true;
        return outerNext(err);
      }
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
    res.once('close', () => {
      if (!captured) fail(new ClientGone('the client closed the connection before the response'));
    });
    let index = 0;
    const next = (err) => {
      if (settled) return;
      if (err !== undefined && err !== null && err !== 'route' && err !== 'router') return fail(err);
      if (index >= handlers.length) {
        if (!outerNext) return fail(new Error('the handlers ended without a response'));
        attempt.downstream = true;
        return outerNext(err);
      }
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
            (e) => {
              pending--;
              fail(e === undefined ? new Error('handler rejected') : e);
            },
          );
        }
      } catch (e) {
        fail(e);
      }
    };
    next();
  });
}

function makeRunner(options, useClaim) {
  const cfg = frontOptions(options);
  const requestPath = cfg.requestPath || ((req) => (req.originalUrl || req.url || '/').split('?', 1)[0] || '/');
  const { logger } = cfg;

  // One transaction: BEGIN + claim, handlers, complete + COMMIT. Returns the answer; throws on errors (rolled back).
  async function attemptOnce(conn, interceptor, ctx, handlers, req, res, attemptNo, outerNext) {
    const { client } = conn;
    const claim = useClaim ? { ...ctx, problemBase: cfg.problemBase } : null;
    try {
      const early = await begin(cfg, client, claim);
      if (early) return early;
      const attempt = interceptor.begin();
      attempt.attemptNo = attemptNo;
      req.idempotency = {
        client, key: ctx.key, scope: ctx.scope, attempt: attemptNo,
        /** Answer without executing (e.g. body validation before any write): rolled back, not stored. */
        notExecuted() {
          attempt.notExecuted = true;
        },
      };
      req.db = client;
      req.body = ctx.bodyValue;
      req.rawBody = ctx.raw;
      let captured;
      try {
        captured = await runChain(handlers, req, res, attempt, outerNext);
      } catch (e) {
        if (!(e instanceof HttpProblem)) throw e;
        captured = e.response; // thrown by a handler: its answer, stored or rolled back by its status
      } finally {
        interceptor.finish();
        if (attempt.downstream) ctx.downstream = true;
      }
      if (captured.status >= 500 || (attempt.notExecuted && captured.status < 500)) {
        await client.query('ROLLBACK'); // not cached, the handler's writes undone, the key free again
        return captured;
      }
      return await commit(cfg, client, claim, captured);
    } catch (e) {
      if (!(await rollback(client))) ctx.broken = e;
      throw e;
    }
  }

  async function handle(handlers, req, res, outerNext) {
    const admitted = await admit(cfg, {
      scopeArg: req,
      keyHeader: req.headers['idempotency-key'],
      method: req.method,
      path: requestPath(req),
      readRaw: () => readRawBody(req, cfg),
    }, useClaim);
    if (admitted.answer) return admitted.answer;
    const { ctx } = admitted;

    let conn;
    try {
      conn = await connect(cfg);
    } catch (e) {
      logger.error('idempotency: cannot connect to the database:', e.message);
      return internalError(cfg, 'the database is unavailable; retry the request');
    }
    const interceptor = interceptResponse(res);
    try {
      for (let attemptNo = 0; attemptNo <= cfg.maxRetries; attemptNo++) {
        try {
          return await attemptOnce(conn, interceptor, ctx, handlers, req, res, attemptNo, outerNext);
        } catch (e) {
          if (e instanceof BadBody) return badBody(cfg);
          if (e instanceof ClientGone) return null;
          if (isRetryable(e) && !ctx.broken && ctx.downstream) return conflict(cfg); // the app cannot run it again
          if (ctx.broken || !isRetryable(e)) {
            const code = sqlstate(e);
            if (code) logger.error(`idempotency: request rolled back: SQLSTATE ${code}: ${e.message}`);
            else logger.error('idempotency: request rolled back:', e);
            return internalError(cfg,
              code
                ? `database error (SQLSTATE ${code}); the request was rolled back`
                : 'the request failed and was rolled back');
          }
          logger.info?.(`idempotency: ${sqlstate(e)} on attempt ${attemptNo + 1}, retrying`);
        }
      }
      return conflict(cfg);
    } finally {
      interceptor.restore();
      conn.release(ctx.broken);
    }
  }

  function wrap(...handlers) {
    handlers = handlers.flat();
    if (handlers.some((h) => typeof h !== 'function')) {
      throw new TypeError('idempotency: give handler functions (req, res, next), or none to use it as a middleware');
    }
    const methods = cfg.methods || (handlers.length === 0 ? new Set(DEFAULT_USE_METHODS) : null);
    return async function idempotencyHandler(req, res, next) {
      if (methods && !methods.has(req.method)) return next();
      let answer;
      try {
        answer = await handle(handlers, req, res, typeof next === 'function' ? next : null);
      } catch (e) {
        logger.error('idempotency: request failed:', e);
        answer = internalError(cfg, 'the request failed');
      }
      if (answer instanceof CapturedResponse) sendResponse(res, answer);
      else if (answer !== null) next(new Error('idempotency: no answer'));
    };
  }

  return wrap;
}

/**
 * `idempotency({pool, scope, ...})` returns `idem`. `idem(...handlers)` is one Express handler that runs `handlers`
 * at most once per Idempotency-Key (within the scope), in one transaction with the claim and the stored response;
 * `idem()` is a middleware for app.use() that protects the routes after it (POST and PATCH unless `methods` is
 * given). Handlers use `req.idempotency.client` (also `req.db`).
 *
 * Options: pool (pg.Pool, required); scope(req) -> string or Promise (the authenticated tenant; may throw
 * HttpProblem, e.g. a 401); ttl (interval text, default the server's idempotency.ttl); maxRetries (3, on
 * 40001/40P01); replayHeaders (allow-list of response headers to store; default all but per-connection ones);
 * isolationLevel ('READ COMMITTED' | 'REPEATABLE READ' | 'SERIALIZABLE'); requestPath(req) (the path in the
 * fingerprint; default the URL path without the query); bodyLimit (bytes, 1 MiB); methods; batching ('auto',
 * 'pipeline', 'multi', 'off'); problemBase; logger.
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
