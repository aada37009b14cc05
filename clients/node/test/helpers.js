// Test helpers: an HTTP server on an ephemeral loopback port, every adapter's app around one handler, and a fake
// pg.Pool that records statements.

import http from 'node:http';
import { readFile } from 'node:fs/promises';
import pg from 'pg';
import express from 'express';
import Koa from 'koa';
import Fastify from 'fastify';
import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { Controller, Module, Post, Req, Res } from '@nestjs/common';
import { fastifyIdempotency, idempotency, koaIdempotency } from '../src/index.js';

export async function listen(app) {
  const server = http.createServer(app);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return served(server, async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });
}

export async function post(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json };
}

/** A pg.Pool on IDEM_TEST_DATABASE_URL with the extension and the tables of clients/schema.sql (made if missing). */
export async function testPool(options) {
  const pool = new pg.Pool({ connectionString: process.env.IDEM_TEST_DATABASE_URL, ...options });
  await pool.query('CREATE EXTENSION IF NOT EXISTS idempotency');
  const { rows: [{ t }] } = await pool.query("SELECT to_regclass('rides') IS NOT NULL AS t");
  if (!t) await pool.query(await readFile(new URL('../../schema.sql', import.meta.url), 'utf8'));
  // CONTRACT.md any-body's table, for a schema.sql without it
  await pool.query('CREATE TABLE IF NOT EXISTS documents (id bigserial PRIMARY KEY, account text NOT NULL, ' +
    'idempotency_key text NOT NULL, content_type text, body bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())');
  return pool;
}

/** A name that no other run uses: `prefix`, the time and a random part. */
export const unique = (prefix) => `${prefix}${Date.now().toString(36)}${Math.floor(Math.random() * 1e6).toString(36)}`;

export function pgError(code, message = `error ${code}`) {
  return Object.assign(new Error(message), { code });
}

/**
 * A fake pg.Pool. `script.claim(params)` gives the claim row (default claimed); `script.query(sql, params)` may
 * answer other statements (return undefined for the default). Every statement is recorded in `log` (with its
 * `name` when it has one). It has one client, pipelined (`pipeline: true`) unless `script.pipeline` is false.
 */
export function fakePool(script = {}) {
  const log = [];
  let client;
  const pool = {
    log,
    connects: 0,
    inflight: 0,
    released: [],
    async connect() {
      pool.connects++;
      client ??= {
        pipeline: script.pipeline !== false,
        on() {},
        removeListener() {},
        release(err) {
          pool.released.push(err);
        },
        async query(sql, params) {
          let name;
          if (typeof sql === 'object') ({ text: sql, values: params, name } = sql);
          // `queued`: sent before the statement ahead of it was answered (the same round trip)
          log.push({ sql, params, ...(name && { name }), ...(pool.inflight > 0 && { queued: true }) });
          pool.inflight++;
          try {
            return await answer(sql, params);
          } finally {
            pool.inflight--;
          }
        },
      };
      return client;
    },
  };
  async function answer(sql, params) {
    if (script.query) {
      const r = await script.query(sql, params, log);
      if (r !== undefined) return r;
    }
    if (/^(BEGIN|ROLLBACK$|COMMIT$)/.test(sql)) return { command: sql.split(' ')[0], rows: [] };
    if (sql.includes('idem_claim_request')) {
      // 1.3: one column, the idem_request_claim value in its text form
      const row = (script.claim ? await script.claim(params, log) : undefined) || { outcome: 'claimed' };
      return { command: 'SELECT', rows: [{ c: recordText(row) }] };
    }
    if (sql.includes('idem_complete_request')) return { command: 'SELECT', rows: [{ stored: true }] };
    if (sql.includes('idem_claim')) {
      const row = script.claim ? await script.claim(params, log) : undefined;
      return { command: 'SELECT', rows: [row || { outcome: 'claimed', http_status: null, response_body: null, response_headers: null }] };
    }
    if (sql.includes('idem_complete')) return { command: 'SELECT', rows: [{ stored: true, body: params[2] }] };
    return { command: 'SELECT', rows: [] };
  }
  return pool;
}

/** The text form of an idem_request_claim value from a 1.0-style row (the stored body as bytea). */
function recordText({ outcome, http_status: status, response_body: body, response_headers: headers }) {
  const quote = (v) => `"${v.replace(/["\\]/g, (m) => m + m)}"`;
  const bytes = body == null ? '' : quote(`\\x${Buffer.from(body).toString('hex')}`);
  return `(${outcome},${status ?? ''},,${headers == null ? '' : quote(headers)},${bytes})`;
}

/** The statements of `log` reduced to a word each: BEGIN, claim, complete, COMMIT, ROLLBACK or the SQL. */
export function steps(log) {
  return log.map(({ sql }) => {
    if (sql.includes('idem_claim')) return 'claim';
    if (sql.includes('idem_complete')) return 'complete';
    return sql;
  });
}

export const quietLogger = { error() {}, info() {}, warn() {}, log() {} };

/**
 * An app of each adapter with `handler(view)` protected on POST /p: view = {db, idem (the handle), body (parsed),
 * status(code), answer(status, body as JSON, headers)}. Options are the adapter's (pool, logger and a scope from
 * X-Account by default); Fastify's `bodyLimit` goes to Fastify itself, which the plugin then follows. Express apps
 * answer an error with a status as {error: message}.
 */
/**
 * A JSON body parser of the plainest kind, reading the request stream itself (what a node:http handler or a Koa
 * body parser does): the middleware hands the stream back whole (CONTRACT.md any-body).
 */
export async function streamJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  return text === '' ? undefined : JSON.parse(text);
}

export const SERVERS = {
  'express route': (pool, handler, options) => {
    const app = express();
    app.post('/p', idempotency(defaults(pool, options))(express.json({ strict: false }),
      (req, res) => handler(nodeView(req, res))));
    return listen(withErrors(app));
  },
  'express app.use': (pool, handler, options) => {
    const app = express();
    app.use(idempotency(defaults(pool, options))());
    app.use(express.json({ strict: false }));
    app.post('/p', (req, res) => handler(nodeView(req, res)));
    return listen(withErrors(app));
  },
  'node:http': (pool, handler, options) =>
    listen(idempotency(defaults(pool, options))(async (req, res) => {
      req.body = await streamJson(req);
      return handler(nodeView(req, res));
    })),
  koa: (pool, handler, options) => {
    const app = new Koa();
    app.silent = true;
    app.use(koaIdempotency(defaults(pool, options)));
    app.use(async (ctx, next) => {
      ctx.request.body = await streamJson(ctx.req);
      return next();
    });
    app.use((ctx) => handler({
      db: ctx.idempotency.client, idem: ctx.idempotency, body: ctx.request.body,
      status: (code) => (ctx.status = code),
      answer(status, body, headers = {}) {
        ctx.status = status;
        ctx.set(headers);
        ctx.body = body;
      },
    }));
    return listen(app.callback());
  },
  // NestJS on Express: the Express adapter as a Nest middleware (decorators applied by hand: plain JavaScript),
  // Nest's own body parser off so that the middleware reads the body (its limit, its 413)
  nestjs: async (pool, handler, options) => {
    class Payments {
      pay(req, res) {
        return handler(nodeView(req, res));
      }
    }
    Controller()(Payments);
    Post('p')(Payments.prototype, 'pay', Object.getOwnPropertyDescriptor(Payments.prototype, 'pay'));
    Req()(Payments.prototype, 'pay', 0);
    Res()(Payments.prototype, 'pay', 1);
    const idem = idempotency(defaults(pool, options));
    class App {
      configure(consumer) {
        consumer.apply(idem(), express.json({ strict: false })).forRoutes(Payments);
      }
    }
    Module({ controllers: [Payments] })(App);
    const app = await NestFactory.create(App, { logger: false, bodyParser: false });
    await app.listen(0, '127.0.0.1');
    return served(app.getHttpServer(), () => app.close());
  },
  fastify: async (pool, handler, { bodyLimit, ...options } = {}) => {
    const app = Fastify(bodyLimit ? { bodyLimit } : {});
    await app.register(fastifyIdempotency, defaults(pool, options));
    app.post('/p', { config: { idempotency: true } }, async (request, reply) => {
      await handler({
        db: request.idempotency.client, idem: request.idempotency, body: request.body,
        status: (code) => reply.code(code),
        answer: (status, body, headers = {}) => reply.code(status).headers(headers).send(body),
      });
      return reply;
    });
    app.post('/open', async () => ({ open: true }));
    await app.listen({ port: 0, host: '127.0.0.1' });
    return served(app.server, () => app.close());
  },
};

/** fn(url) with the app that SERVERS[name] makes, closed afterwards. */
export async function withServer(name, pool, handler, fn, options) {
  const srv = await SERVERS[name](pool, handler, options);
  try {
    return await fn(`${srv.url}/p`);
  } finally {
    await srv.close();
  }
}

function defaults(pool, options) {
  return { pool, logger: quietLogger, scope: (req) => req.headers['x-account'] || '', ...options };
}

/** The view of a node:http request (Express, NestJS): JSON written with writeHead() and end(). */
function nodeView(req, res) {
  return {
    db: req.db, idem: req.idempotency, body: req.body,
    status: (code) => (res.statusCode = code),
    answer(status, body, headers = {}) {
      res.writeHead(status, { 'Content-Type': 'application/json; charset=utf-8', ...headers });
      res.end(JSON.stringify(body));
    },
  };
}

function withErrors(app) {
  // eslint-disable-next-line no-unused-vars
  app.use((err, req, res, next) => res.status(err.status || 500).json({ error: err.message }));
  return app;
}

function served(server, close) {
  return { url: `http://127.0.0.1:${server.address().port}`, server, close };
}
