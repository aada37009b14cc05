// Koa over the engine: `app.use(koaIdempotency({pool, scope}))` before the routes. The claim is made, `await next()`
// runs the rest of the app in the claim's transaction (statements on ctx.idempotency.client), and what the app left
// in ctx.status, ctx.body and the response headers is stored and committed before Koa writes it.
//
// The status committed is the status sent. Koa answers a thrown error after the middleware has returned, outside
// it, so the middleware answers an error carrying a `status` (ctx.throw(422), http-errors) itself, the way Koa's
// default handler does (status, err.headers, the message when err.expose, else the status text; or
// `renderError(err, ctx)` when given): a 4xx is stored, a 5xx rolled back; any other error is rolled back and
// answered 500 problem+json.

import { STATUS_CODES } from 'node:http';
import { errorStatus, execute, options, pathOf, queryOf, readBody, refill } from './engine.js';
import { CapturedResponse, bytesOf, compatJsonBody, wireHeaders } from './responses.js';

function defaultRenderError(err, ctx) {
  ctx.status = errorStatus(err);
  if (err.headers) ctx.set(err.headers);
  ctx.type = 'text/plain';
  ctx.body = err.expose ? err.message : STATUS_CODES[ctx.status];
}

/**
 * The Koa middleware. Options as idempotency() (scope is called with ctx), plus `methods` (default POST, PATCH:
 * other requests pass through untouched) and `renderError(err, ctx)` (how a thrown error with a status is
 * answered). Handlers find {client, key, scope, notExecuted()} in ctx.idempotency (also ctx.state.idempotency),
 * the body's bytes in ctx.request.rawBody; the request stream is handed back unread, so a body parser after the
 * middleware parses it (CONTRACT.md any-body).
 */
export function koaIdempotency(opts) {
  const cfg = options(opts);
  const methods = cfg.methods || new Set(['POST', 'PATCH']);
  const renderError = (opts && opts.renderError) || defaultRenderError;
  // the request line's target (ctx.originalUrl), not ctx.path: that one is decoded by nothing but rewritten by a
  // mount (koa-mount strips its prefix) and cut at a '#' by url.parse()
  const requestPath = cfg.requestPath || ((ctx) => pathOf(ctx.originalUrl));

  return async function idempotencyKoa(ctx, next) {
    if (!methods.has(ctx.method)) return next();
    const { request } = ctx;
    const answer = await execute(cfg, {
      scopeArg: ctx, keyHeader: ctx.req.headers['idempotency-key'], method: ctx.method, path: requestPath(ctx),
      query: queryOf(ctx.originalUrl),
      body: async () => {
        // a body parser that ran before (koa-bodyparser keeps rawBody), else the whole body from the socket
        if (request.rawBody !== undefined) return Buffer.from(request.rawBody);
        if (request.body !== undefined) return Buffer.from(JSON.stringify(request.body), 'utf8');
        // read whole, then given back to ctx.req: a body parser after the middleware reads it as usual
        const body = await readBody(ctx.req, cfg, ctx.req.headers['content-length']);
        refill(ctx.req, body);
        return body;
      },
      contentType: ctx.req.headers['content-type'] ?? null,
    }, async (handle, req) => {
      ctx.idempotency = ctx.state.idempotency = handle;
      if (request.rawBody === undefined) request.rawBody = req.raw;
      // a JSON body also parsed into ctx.request.body, as 1.3 did, for apps with no body parser after it
      if (request.body === undefined) request.body = compatJsonBody(req.raw, req.contentType);
      try {
        await next();
      } catch (err) {
        if (errorStatus(err) === null) throw err; // rolled back, 500
        renderError(err, ctx);
      }
      return new CapturedResponse(ctx.status, Object.entries(ctx.response.headers), await bytesOf(ctx.body));
    });
    ctx.status = answer.status;
    for (const [k, v] of wireHeaders(answer)) ctx.set(k, v);
    ctx.body = answer.body; // a Buffer: Koa keeps the Content-Type already set and sets Content-Length
  };
}
