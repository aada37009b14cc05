// Fastify over the engine: `fastify.register(fastifyIdempotency, {pool, scope})`, then mark the routes to protect
// with `config: { idempotency: true }`. No reply.hijack() and no body parser of its own: preParsing reads the whole
// body (413 at once over the limit, nothing run from a body cut short) and hands Fastify's own parser a copy,
// preHandler claims, and onSend stores what Fastify is about to write, after its serializer and its error handler,
// so the status committed is the status sent: an error thrown by the handler is answered by Fastify's error
// handler (yours or the default), and that answer is stored when it is a 4xx and rolled back when it is a 5xx.

import { Readable } from 'node:stream';
import { finished } from 'node:stream/promises';
import { open, options, pathOf, queryOf, readBody } from './engine.js';
import { CapturedResponse, HttpProblem, bytesOf, renderAnswer, storeOptions, wireHeaders } from './responses.js';

const BODY = Symbol('idempotency.body');
const TX = Symbol('idempotency.tx');

function enabled(request) {
  const config = request.routeOptions && request.routeOptions.config;
  return Boolean(config && config.idempotency);
}

const STORE = new WeakMap();
/** The route's store-less options: `config: {idempotency: {redact: [...], storeBody: false}}` (true: none). */
function storeOf(request) {
  const { config } = request.routeOptions;
  if (typeof config.idempotency !== 'object') return undefined;
  if (!STORE.has(config)) STORE.set(config, storeOptions(config.idempotency));
  return STORE.get(config);
}

/** Answer from a hook, resolving once the answer is written, so that Fastify goes no further with the request. */
async function send(reply, answer) {
  reply.code(answer.status);
  for (const [k, v] of wireHeaders(answer)) reply.header(k, v);
  reply.send(answer.body);
  await finished(reply.raw).catch(() => {});
  return reply;
}

/**
 * The plugin. Options as idempotency() (scope is called with the Fastify request). Handlers find {client, key,
 * scope, notExecuted()} in request.idempotency and the raw body in request.rawBody. The body limit is the
 * `bodyLimit` option, else the route's (Fastify's `bodyLimit`, 1 MiB by default); over it: 413 problem+json.
 */
export function fastifyIdempotency(fastify, opts, done) {
  const cfg = options({ ...opts, bodyLimit: opts.bodyLimit ?? Number.MAX_SAFE_INTEGER });
  // the request line's target: the url before rewriteUrl (request.originalUrl, kept on the raw request too), else url
  const target = (request) => request.originalUrl ?? request.raw.originalUrl ?? request.url;
  const requestPath = cfg.requestPath || ((request) => pathOf(target(request)));
  fastify.decorateRequest('idempotency', null);
  fastify.decorateRequest('rawBody', null);

  fastify.addHook('preParsing', async (request, reply, payload) => {
    if (!enabled(request)) return payload;
    const limit = opts.bodyLimit ?? request.routeOptions.bodyLimit ?? fastify.initialConfig.bodyLimit;
    try {
      request[BODY] = await readBody(payload, cfg, request.headers['content-length'], limit);
    } catch (e) {
      if (!(e instanceof HttpProblem)) throw e;
      await send(reply, renderAnswer(e.response, cfg.renderProblem)); // answered: Fastify goes no further
      return undefined;
    }
    const copy = Readable.from([request[BODY]], { objectMode: false });
    copy.receivedEncodedLength = request[BODY].length;
    return copy;
  });

  fastify.addHook('preHandler', async (request, reply) => {
    if (!enabled(request)) return undefined;
    const opened = await open(cfg, {
      scopeArg: request, keyHeader: request.headers['idempotency-key'], method: request.method,
      path: requestPath(request), query: queryOf(target(request)), body: async () => request[BODY] ?? Buffer.alloc(0),
      contentType: request.headers['content-type'] ?? null, store: storeOf(request),
    });
    if (!opened.handle) return opened.answer && send(reply, opened.answer);
    request[TX] = opened;
    request.idempotency = opened.handle;
    request.rawBody = opened.request.raw;
    return undefined;
  });

  fastify.addHook('onSend', async (request, reply, payload) => {
    const tx = request[TX];
    if (!tx) return payload;
    request[TX] = null;
    let answer;
    try {
      const headers = Object.entries(reply.getHeaders()).filter(([, v]) => v !== undefined);
      answer = await tx.close(new CapturedResponse(reply.statusCode, headers, await bytesOf(payload)));
    } catch (e) {
      answer = await tx.abort(e);
    }
    // the stored form of the body, or a problem when the COMMIT failed
    reply.code(answer.status);
    for (const [k, v] of wireHeaders(answer)) reply.header(k, v);
    reply.removeHeader('content-length');
    return answer.body;
  });

  // A request that ends without onSend (a hijacked reply, a lost connection): roll back, give the connection back.
  fastify.addHook('onResponse', async (request) => {
    const tx = request[TX];
    request[TX] = null;
    if (tx) await tx.abort();
  });
  done();
}

// Not encapsulated: the hooks apply to the routes of the instance that registers the plugin.
fastifyIdempotency[Symbol.for('skip-override')] = true;
fastifyIdempotency[Symbol.for('fastify.display-name')] = 'idempotency-pg';
