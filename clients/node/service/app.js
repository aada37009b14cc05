// The payment service of clients/CONTRACT.md, as an Express app around the idempotency middleware.

import express from 'express';
import {
  DEFAULT_BODY_LIMIT, HttpProblem, errorStatus, idempotency, problem, readRawBody, sendResponse, transactional,
} from '../src/index.js';
import { STATUS_CODES } from 'node:http';
import { createHash } from 'node:crypto';
import querystring from 'node:querystring';
import { ridesHandler } from './rides.js';

const CURRENCY = /^[A-Z]{3}$/;

const UNAUTHORIZED = 'send Authorization: Bearer <account>, the account being [a-z0-9_]{1,64}';
const NOT_AN_OBJECT = 'the body must be a JSON object {"amount_cents": <integer > 0>, "currency": "<ISO 4217>"}';
const AMOUNT = `amount_cents must be an integer from 1 to ${Number.MAX_SAFE_INTEGER}`;
// A string or a number of JSON text that is known to be valid: the numbers are rewritten as strings marked with a
// leading NUL (which a request body cannot hold: parseJsonBody refuses \u0000), so their text survives parsing.
const TOKEN = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;

/** The account of `Authorization: Bearer <account>`, or HttpProblem 401. The idempotency scope is the account. */
export function authenticate(req) {
  const lines = req.rawHeaders.filter((h, i) => i % 2 === 0 && h.toLowerCase() === 'authorization').length;
  const match = /^[Bb][Ee][Aa][Rr][Ee][Rr] ([a-z0-9_]{1,64})$/.exec(req.headers.authorization ?? '');
  if (!match || lines !== 1) {
    throw new HttpProblem(401, 'unauthorized', 'Unauthorized', UNAUTHORIZED, [['WWW-Authenticate', 'Bearer']]);
  }
  return match[1];
}

function sendJson(res, status, text, headers = {}) {
  res.statusCode = status;
  res.setHeader('Content-Type', 'application/json');
  for (const [k, v] of Object.entries(headers)) res.setHeader(k, v);
  res.end(text);
}

function sendProblem(res, status, slug, title, detail, headers = []) {
  sendResponse(res, problem(status, slug, title, detail, headers));
}

/**
 * The amount and currency of a payment body (JSON text), or {error} saying what is wrong, as CONTRACT.md and the Go
 * service decide: a JSON object (null counts as one without members) whose amount_cents is written as an integer
 * from 1 to 2^53 - 1 (not 1e2, not 100.0) and whose currency is a string of 3 upper-case letters.
 */
export function validatePayment(text) {
  const body = JSON.parse(text.replace(TOKEN, (t) => (t[0] === '"' ? t : `"\\u0000${t}"`)));
  if (body !== null && (typeof body !== 'object' || Array.isArray(body))) return { error: NOT_AN_OBJECT };
  const amount = body?.amount_cents;
  const written = typeof amount === 'string' && amount[0] === '\0' ? amount.slice(1) : '';
  if (!/^[1-9][0-9]{0,15}$/.test(written) || Number(written) > Number.MAX_SAFE_INTEGER) return { error: AMOUNT };
  const currency = body.currency;
  if (typeof currency !== 'string' || !CURRENCY.test(currency)) return { error: 'currency must be 3 upper-case letters' };
  return { amount: Number(written), currency };
}

/** The media type of a Content-Type value, lower-cased, without its parameters ('' when there is none). */
function mediaType(value) {
  return String(value ?? '').split(';', 1)[0].trim().toLowerCase();
}

/** The payment of form fields (text values): amount_cents written as the JSON rule allows, currency as there. */
function fieldsPayment(fields) {
  const amount = fields.amount_cents;
  if (typeof amount !== 'string' || !/^[1-9][0-9]{0,15}$/.test(amount) || Number(amount) > Number.MAX_SAFE_INTEGER) {
    return { error: AMOUNT };
  }
  const { currency } = fields;
  if (typeof currency !== 'string' || !CURRENCY.test(currency)) return { error: 'currency must be 3 upper-case letters' };
  return { amount: Number(amount), currency };
}

/**
 * The payment a body says (CONTRACT.md any-body): form fields (`form`: as a body parser read them, else parsed
 * here), multipart's fields, else a JSON object as validatePayment reads it; null when the body cannot be read as
 * the one its Content-Type says.
 */
export async function paymentOf(contentType, raw, form = undefined) {
  const type = mediaType(contentType);
  try {
    if (type === 'application/x-www-form-urlencoded') return fieldsPayment(form ?? querystring.parse(raw.toString('utf8')));
    if (type === 'multipart/form-data') {
      const parts = await new Response(raw, { headers: { 'Content-Type': contentType } }).formData();
      const fields = {};
      for (const [name, value] of parts) fields[name] = name in fields ? [fields[name], value] : value;
      return fieldsPayment(fields);
    }
    return validatePayment(raw.toString('utf8'));
  } catch {
    return null;
  }
}

/** The payment of a request to /payments: a form as express.urlencoded() parsed it (in the route, after the middleware). */
export function readPayment(req) {
  return paymentOf(req.headers['content-type'], req.rawBody, req.body);
}

function paymentJson(id, account, { amount, currency }) {
  return JSON.stringify({ payment_id: id, account, amount_cents: amount, currency });
}

/** The payment handler, shared by /payments and /payments-unprotected; runs inside the request's transaction. */
export function paymentHandler({ faults = false } = {}) {
  return async function pay(req, res) {
    const { client, key, scope: account } = req.idempotency;
    const payment = await readPayment(req);
    if (payment === null) {
      req.idempotency.notExecuted();
      sendProblem(res, 400, 'request-body-not-json', 'Malformed request body', 'the request body is not JSON');
      return;
    }
    if (payment.error) {
      // validation before any write: answered, not stored, the key released for the corrected retry
      req.idempotency.notExecuted();
      sendProblem(res, 422, 'invalid-payment', 'Invalid payment', payment.error);
      return;
    }
    const { rows } = await client.query(
      'INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id',
      [account, -payment.amount, payment.currency, key ?? ''],
    );
    const id = Number(rows[0].id);
    const fault = faults ? req.headers['x-fault'] : undefined;
    if (fault === '503') {
      sendProblem(res, 503, 'upstream-unavailable', 'Service Unavailable', 'upstream unavailable');
      return;
    }
    if (fault === 'throw-422' || fault === 'throw-502') {
      // an error with an HTTP status, as http-errors makes them: Express's error handler below answers it
      const status = Number(fault.slice('throw-'.length));
      throw Object.assign(new Error(status === 422 ? 'the payment was refused' : 'the upstream failed'), { status });
    }
    if (fault === 'db-error') {
      await client.query('SELECT 1/0');
    } else if (typeof fault === 'string' && fault.startsWith('sleep=')) {
      const ms = Number(fault.slice('sleep='.length));
      if (Number.isFinite(ms) && ms >= 0) await client.query('SELECT pg_sleep($1::float8 / 1000.0)', [ms]);
    }
    sendJson(res, 201, paymentJson(id, account, payment), { Location: `/payments/${id}` });
  };
}

/** POST /documents (CONTRACT.md any-body): a body of any type, empty included, stored as its bytes. */
export async function documentHandler(req, res) {
  const { client, key, scope: account } = req.idempotency;
  const contentType = req.headers['content-type'] ?? null;
  const { rows } = await client.query(
    'INSERT INTO documents (account, idempotency_key, content_type, body) VALUES ($1, $2, $3, $4) RETURNING id',
    [account, key, contentType, req.rawBody],
  );
  const id = Number(rows[0].id);
  sendJson(res, 201, JSON.stringify({
    document_id: id, content_type: contentType, bytes: req.rawBody.length,
    sha256: createHash('sha256').update(req.rawBody).digest('hex'),
  }), { Location: `/documents/${id}` });
}

/**
 * The Express app. `pool` is a pg.Pool; `faults` enables the X-Fault header; `prepared` is the middleware's option
 * of that name; `bench` adds POST /payments-autocommit (the handler's one INSERT in autocommit: the benchmark's
 * unprotected reference); `ridesLeaseSeconds` is the lease of POST /rides (lease mode).
 */
export function createApp({
  pool, faults = false, logger = console, prepared = 'auto', bench = false, ridesLeaseSeconds = 30,
} = {}) {
  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');

  const idem = idempotency({
    pool, scope: authenticate, replayHeaders: ['Content-Type', 'Location'], logger, prepared,
  });
  const tx = transactional({ pool, scope: authenticate, logger, prepared });
  const pay = paymentHandler({ faults });

  const notAllowed = (allow) => (req, res) =>
    sendProblem(res, 405, 'method-not-allowed', 'Method Not Allowed', `${req.method} is not allowed here`, [['Allow', allow]]);

  app.get('/healthz', (req, res) => sendJson(res, 200, '{"ok":true}')); // Express answers HEAD with the GET route
  app.all('/healthz', notAllowed('GET, HEAD'));
  // a form body is parsed by Express's own parser after the middleware (CONTRACT.md any-body)
  const form = express.urlencoded({ extended: false, limit: DEFAULT_BODY_LIMIT });
  app.post('/payments', idem(form, pay));
  app.all('/payments', notAllowed('POST'));
  // POST /payments at any path under /files/ (CONTRACT.md, rule raw-target): the fingerprint has the target as sent.
  app.post('/files/*name', idem(form, pay));
  app.all('/files/*name', notAllowed('POST'));
  app.post('/documents', idem(documentHandler));
  app.all('/documents', notAllowed('POST'));
  app.post('/payments-unprotected', tx(form, pay));
  app.all('/payments-unprotected', notAllowed('POST'));
  app.post('/rides', ridesHandler({ pool, authenticate, paymentOf, leaseSeconds: ridesLeaseSeconds, faults, logger }));
  app.all('/rides', notAllowed('POST'));

  if (bench) {
    app.post('/payments-autocommit', async (req, res, next) => {
      try {
        const account = authenticate(req);
        const payment = validatePayment((await readRawBody(req, DEFAULT_BODY_LIMIT)).toString('utf8'));
        if (payment.error) return sendProblem(res, 422, 'invalid-payment', 'Invalid payment', payment.error);
        const { rows } = await pool.query(
          'INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id',
          [account, -payment.amount, payment.currency, ''],
        );
        const id = Number(rows[0].id);
        sendJson(res, 201, paymentJson(id, account, payment), { Location: `/payments/${id}` });
      } catch (e) {
        if (e instanceof HttpProblem) sendResponse(res, e.response);
        else next(e);
      }
    });
  }

  app.use((req, res) => sendProblem(res, 404, 'not-found', 'Not Found', `${req.path} is not a resource here`));
  // The app's error handler: an error with an HTTP status is answered with it (inside /payments the middleware
  // stores that answer when it is a 4xx); anything else is a 500.
  // eslint-disable-next-line no-unused-vars
  app.use((err, req, res, next) => {
    const status = errorStatus(err);
    if (status === null) logger.error('payments: unhandled error:', err);
    if (res.headersSent) return;
    if (status === null) sendProblem(res, 500, 'internal-error', 'Internal Server Error', 'the request failed and was rolled back');
    else sendProblem(res, status, `http-${status}`, STATUS_CODES[status] || 'Error', err.message);
  });
  return app;
}
