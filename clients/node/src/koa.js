// Koa: `app.use(koaIdempotency({pool, scope}))` before the routes. The claim is made, `await next()` runs the rest of
// the app in the claim's transaction (statements on ctx.idempotency.client), and what the app left in ctx.status,
// ctx.body and the response headers is stored and committed before Koa writes it.
//
// The status committed is the status sent. Koa answers a thrown error after the middleware has returned, outside
// it, so the middleware answers an error carrying a 4xx `status` (ctx.throw(422), http-errors) itself, the way Koa's
// default handler does (status, err.headers, the message when err.expose, else the status text; or
// `renderError(err, ctx)` when given) and stores that; any other error rolls back and goes on to Koa.

import { Readable } from 'node:stream';
import { STATUS_CODES } from 'node:http';
import { CapturedResponse } from './responses.js';
import { admit, frontOptions, internalError, readStream } from './request.js';
import { errorStatus } from './middleware.js';
import { handle, openSession } from './session.js';

const DEFAULT_METHODS = ['POST', 'PATCH'];

async function bodyBytes(body) {
  if (body === null || body === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(body)) return body;
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  if (body instanceof Readable || typeof body.pipe === 'function') {
    const chunks = [];
    for await (const chunk of body) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return Buffer.from(JSON.stringify(body), 'utf8'); // what Koa sends for an object
}

/** Put `answer` (a CapturedResponse) into ctx for Koa to send. */
function respond(ctx, answer) {
  ctx.status = answer.status;
  for (const [k, v] of answer.headers) {
    const lk = k.toLowerCase();
    if (lk !== 'content-length' && lk !== 'transfer-encoding') ctx.set(k, v);
  }
  ctx.body = answer.body; // a Buffer: Koa keeps the Content-Type already set and sets Content-Length
}

function defaultRenderError(err, ctx) {
  const status = errorStatus(err);
  ctx.status = status;
  if (err.headers) ctx.set(err.headers);
  ctx.type = 'text/plain';
  ctx.body = err.expose ? err.message : STATUS_CODES[status];
}

/**
 * The Koa middleware. Options as idempotency() (scope is called with ctx), plus `methods` (default POST, PATCH:
 * other requests pass through untouched) and `renderError(err, ctx)` (how a thrown 4xx error is answered).
 * Handlers find {client, key, scope, notExecuted()} in ctx.idempotency (also ctx.state.idempotency), the parsed
 * body in ctx.request.body and its bytes in ctx.request.rawBody.
 */
export function koaIdempotency(options) {
  const cfg = frontOptions(options);
  const methods = cfg.methods || new Set(DEFAULT_METHODS);
  const renderError = (options && options.renderError) || defaultRenderError;
  const requestPath = cfg.requestPath || ((ctx) => ctx.path);

  return async function idempotencyKoa(ctx, next) {
    if (!methods.has(ctx.method)) return next();
    const admitted = await admit(cfg, {
      scopeArg: ctx,
      keyHeader: ctx.req.headers['idempotency-key'],
      method: ctx.method,
      path: requestPath(ctx),
      readRaw: () => {
        const { request } = ctx;
        if (request.rawBody !== undefined) return Buffer.from(request.rawBody);
        if (request.body !== undefined) return Buffer.from(JSON.stringify(request.body), 'utf8');
        return readStream(ctx.req, cfg);
      },
    }, true);
    if (admitted.answer) return respond(ctx, admitted.answer);
    const { ctx: rc } = admitted;
    const opened = await openSession(cfg, rc);
    if (opened.answer) return respond(ctx, opened.answer);
    const { session } = opened;
    ctx.idempotency = handle(session, rc);
    ctx.state.idempotency = ctx.idempotency;
    ctx.request.body = rc.bodyValue;
    ctx.request.rawBody = rc.bodyText;
    try {
      await next();
    } catch (err) {
      const status = errorStatus(err);
      if (status === null || status >= 500) {
        await session.abort(err);
        throw err; // Koa answers it; nothing stored, the writes undone
      }
      renderError(err, ctx);
    }
    let captured;
    try {
      const body = await bodyBytes(ctx.body);
      captured = new CapturedResponse(ctx.status, Object.entries(ctx.response.headers), body);
    } catch (e) {
      await session.abort(e);
      cfg.logger.error('idempotency: cannot read the response body:', e);
      return respond(ctx, internalError(cfg, 'the response could not be read'));
    }
    respond(ctx, await session.close(captured));
  };
}
