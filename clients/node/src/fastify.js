// Fastify: `fastify.register(fastifyIdempotency, {pool, scope})`, then mark the routes to protect with
// `config: { idempotency: true }`. No reply.hijack(), no body parser of its own: the plugin keeps a copy of the raw
// body bytes as Fastify's own parser reads them (preParsing), claims in preHandler, and stores in onSend what
// Fastify is about to write, after its serializer and its error handler, so the status committed is the status
// sent: an error thrown by the handler is answered by Fastify's error handler (yours or the default), and that
// answer is stored when it is a 4xx and rolled back when it is a 5xx.

import { Readable, Transform } from 'node:stream';
import { CapturedResponse } from './responses.js';
import { admit, frontOptions } from './request.js';
import { handle, openSession } from './session.js';

const RAW = Symbol('idempotency.raw');
const SESSION = Symbol('idempotency.session');

function enabled(request) {
  const config = request.routeOptions && request.routeOptions.config;
  return Boolean(config && config.idempotency);
}

function headerPairs(headers) {
  return Object.entries(headers).filter(([, v]) => v !== undefined);
}

function sendAnswer(reply, answer) {
  reply.code(answer.status);
  for (const [k, v] of answer.headers) {
    const lk = k.toLowerCase();
    if (lk !== 'content-length' && lk !== 'transfer-encoding') reply.header(k, v);
  }
  return reply.send(answer.body);
}

async function payloadBytes(payload) {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(payload)) return payload;
  if (typeof payload === 'string') return Buffer.from(payload, 'utf8');
  if (payload instanceof Readable || typeof payload.pipe === 'function') {
    const chunks = [];
    for await (const chunk of payload) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return Buffer.from(String(payload), 'utf8');
}

/**
 * The plugin. Options as idempotency() (scope is called with the Fastify request). Handlers find {client, key,
 * scope, notExecuted()} in request.idempotency and the raw body in request.rawBody. The body limit is Fastify's
 * own `bodyLimit` (1 MiB by default, 413 over it).
 */
export function fastifyIdempotency(fastify, options, done) {
  const cfg = frontOptions({ ...options, bodyLimit: options.bodyLimit ?? Number.MAX_SAFE_INTEGER });
  const requestPath = cfg.requestPath || ((request) => request.url.split('?', 1)[0] || '/');
  fastify.decorateRequest('idempotency', null);
  fastify.decorateRequest('rawBody', null);

  fastify.addHook('preParsing', async (request, reply, payload) => {
    if (!enabled(request)) return payload;
    const chunks = [];
    request[RAW] = chunks;
    // a copy of each chunk as Fastify's parser pulls it (no listener of its own, so nothing flows early)
    const copy = new Transform({
      transform(chunk, encoding, callback) {
        chunks.push(chunk);
        callback(null, chunk);
      },
    });
    copy.receivedEncodedLength = payload.receivedEncodedLength;
    payload.on('error', (e) => copy.destroy(e));
    return payload.pipe(copy);
  });

  fastify.addHook('preHandler', async (request, reply) => {
    if (!enabled(request)) return;
    const admitted = await admit(cfg, {
      scopeArg: request,
      keyHeader: request.headers['idempotency-key'],
      method: request.method,
      path: requestPath(request),
      readRaw: async () => Buffer.concat(request[RAW] || []),
    }, true);
    if (admitted.answer) return sendAnswer(reply, admitted.answer);
    const opened = await openSession(cfg, admitted.ctx);
    if (opened.answer) return sendAnswer(reply, opened.answer);
    request[SESSION] = opened.session;
    request.idempotency = handle(opened.session, admitted.ctx);
    request.rawBody = admitted.ctx.raw;
  });

  fastify.addHook('onSend', async (request, reply, payload) => {
    const session = request[SESSION];
    if (!session) return payload;
    request[SESSION] = null;
    let body;
    try {
      body = await payloadBytes(payload);
    } catch (e) {
      await session.abort(e);
      throw e;
    }
    const captured = new CapturedResponse(reply.statusCode, headerPairs(reply.getHeaders()), body);
    const answer = await session.close(captured);
    if (answer !== captured) {
      // the stored form of the body, or a problem when the COMMIT failed
      if (answer.status !== reply.statusCode) reply.code(answer.status);
      for (const [k, v] of answer.headers) {
        const lk = k.toLowerCase();
        if (lk !== 'content-length' && lk !== 'transfer-encoding') reply.header(k, v);
      }
      reply.removeHeader('content-length');
    }
    return answer.body;
  });

  // A request that ends without onSend (a hijacked reply, a lost connection): roll back and give the connection back.
  fastify.addHook('onResponse', async (request) => {
    const session = request[SESSION];
    if (session) {
      request[SESSION] = null;
      await session.abort();
    }
  });
  done();
}

// Not encapsulated: the hooks apply to the routes of the instance that registers the plugin.
fastifyIdempotency[Symbol.for('skip-override')] = true;
fastifyIdempotency[Symbol.for('fastify.display-name')] = 'idempotency-pg';
