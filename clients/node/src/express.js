// Express (and any node:http `(req, res, next)` stack: NestJS on Express, a plain http.createServer) over the
// engine. Two ways to mount it:
// - `app.post('/payments', idem(handler, ...))`: the adapter runs the handlers itself, so it knows when they are
//   done, sees every error they throw or pass to next(err), and runs them again on 40001/40P01;
// - `app.use(idem())` (or `app.post('/payments', idem(), handler)`): a middleware before the routes. It claims and
//   calls next(); whatever the rest of the app writes is held back until it ends (a 40001 there cannot be run
//   again: 409 Retry-After).
// The status committed is the status sent: the response stays held back through Express's own error handlers, so
// an error with an HTTP status (a thrown 422, next(err) with http-errors' status) is answered by the app's error
// handlers and that answer is what is stored (a 4xx) or rolled back (a 5xx). An error without a status is rolled
// back and answered 500 problem+json.

import { interceptResponse, sendResponse } from './capture.js';
import { ClientGone, errorStatus, execute, internalError, options, pathOf, queryOf, readBody, refill } from './engine.js';
import { HttpProblem, compatJsonBody, renderAnswer, storeOptions } from './responses.js';

/**
 * The raw request body: from a body parser that already ran (req.rawBody, a Buffer or string req.body), or read
 * whole from the request and given back to it (refill): the body parsers after the middleware read it as usual.
 */
export async function readRawBody(req, cfg) {
  if (typeof cfg === 'number') cfg = { bodyLimit: cfg };
  if (req.rawBody !== undefined && req.rawBody !== null) return Buffer.from(req.rawBody);
  if (req._body || (req.body !== undefined && req.readableEnded)) {
    const b = req.body;
    if (Buffer.isBuffer(b)) return b;
    return Buffer.from(typeof b === 'string' ? b : JSON.stringify(b ?? null), 'utf8');
  }
  const body = await readBody(req, cfg, req.headers['content-length']);
  refill(req, body);
  return body;
}

/**
 * Run handlers `(req, res, next)` in sequence. Resolves with the captured response once it has ended and every
 * promise a handler returned has settled; rejects when a handler throws, rejects, or calls next(err) with an error
 * the app's error handlers do not answer, or when the chain ends without a response and there is no `outerNext`.
 * With `outerNext`, the last handler's next() hands the request on to the rest of the app (handle.once is set).
 */
function runChain(handlers, req, res, capture, handle, outerNext) {
  return new Promise((resolve, reject) => {
    let settled = false;
    let pending = 0;
    let captured = null;
    let handedError = false;
    const fail = (err) => {
      if (settled) return;
      if (outerNext && !handedError && errorStatus(err) !== null && !(err instanceof HttpProblem)) {
        // Express's error handlers answer it into the held-back response: that answer is stored or rolled back
        handedError = handle.once = true;
        return outerNext(err);
      }
      settled = true;
      reject(err instanceof Error ? err : new Error(`handler failed: ${String(err)}`));
    };
    const maybeDone = () => {
      if (!settled && captured && pending === 0) resolve((settled = true) && captured);
    };
    capture.done.then((c) => maybeDone((captured = c)));
    res.once('close', () => captured || fail(new ClientGone('the client closed the connection before the response')));
    let index = 0;
    const next = (err) => {
      if (settled) return;
      if (err !== undefined && err !== null && err !== 'route' && err !== 'router') return fail(err);
      if (index >= handlers.length) {
        if (!outerNext) return fail(new Error('the handlers ended without a response'));
        handle.once = true;
        return outerNext();
      }
      try {
        const result = handlers[index++](req, res, next);
        if (result && typeof result.then === 'function') {
          pending++;
          result.then(() => maybeDone(pending--), (e) => fail(e ?? new Error('handler rejected'), pending--));
        }
      } catch (e) {
        fail(e);
      }
    };
    next();
  });
}

function makeRunner(opts, claim) {
  const cfg = options(opts);
  // the request line's target (req.originalUrl: req.url less the prefix of the router it is mounted on)
  const requestPath = cfg.requestPath || ((req) => pathOf(req.originalUrl || req.url));
  return function wrap(...handlers) {
    // per route (CONTRACT.md store-less): idem({redact: ['/card/number'], storeBody: false}, handler)
    const store = handlers.length > 0 && handlers[0] && typeof handlers[0] === 'object' && !Array.isArray(handlers[0])
      ? storeOptions(handlers.shift()) : undefined;
    handlers = handlers.flat();
    if (handlers.some((h) => typeof h !== 'function')) {
      throw new TypeError('idempotency: give handler functions (req, res, next), or none to use it as a middleware');
    }
    const methods = cfg.methods || (handlers.length === 0 ? new Set(['POST', 'PATCH']) : null);
    return async function idempotencyHandler(req, res, next) {
      if (methods && !methods.has(req.method)) return next();
      const outerNext = typeof next === 'function' ? next : null;
      const interceptor = interceptResponse(res);
      let answer;
      try {
        answer = await execute(cfg, {
          scopeArg: req, keyHeader: req.headers['idempotency-key'], method: req.method, path: requestPath(req),
          query: queryOf(req.originalUrl || req.url), body: () => readRawBody(req, cfg), claim, rerun: handlers.length > 0,
          contentType: req.headers['content-type'] ?? null, store,
        }, async (handle, request) => {
          req.idempotency = handle;
          req.db = handle.client;
          req.rawBody = request.raw; // the body itself: the app's body parsers read it, as without the middleware
          // a JSON body also parsed into req.body, as 1.3 did, for handlers written without a parser after it
          if (req.body === undefined) req.body = compatJsonBody(request.raw, request.contentType);
          if (handle.attempt > 0) refill(req, request.raw); // a run again (40001): its parsers read the body again
          try {
            return await runChain(handlers, req, res, interceptor.begin(), handle, outerNext);
          } finally {
            interceptor.finish();
          }
        });
      } catch (e) {
        cfg.logger.error('idempotency: request failed:', e);
        answer = renderAnswer(internalError(cfg, 'the request failed'), cfg.renderProblem);
      } finally {
        interceptor.restore();
      }
      if (answer) sendResponse(res, answer);
    };
  };
}

/**
 * `idempotency({pool, scope, ...})` returns `idem`. `idem(...handlers)` is one Express handler that runs `handlers`
 * at most once per Idempotency-Key (within the scope), in one transaction with the claim and the stored response;
 * `idem()` is a middleware for app.use() that protects the routes after it (POST and PATCH unless `methods` is
 * given). Handlers use `req.idempotency.client` (also `req.db`). Options: see index.d.ts (IdempotencyOptions).
 */
export function idempotency(opts) {
  return makeRunner(opts, true);
}

/**
 * The same transaction around `handlers` without any Idempotency-Key (no claim, nothing stored): BEGIN, handlers,
 * COMMIT, or ROLLBACK on a 5xx or an error; retried on 40001/40P01.
 */
export function transactional(opts) {
  return makeRunner(opts, false);
}
