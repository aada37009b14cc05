// What every adapter does before the database: the scope, the Idempotency-Key, the request body as JSON text.
// Each step may answer at once (401 from the scope function, 400 for the key, 413, 400 for a body that is not
// JSON); nothing is claimed then, so the key stays free.

import { KeyHeaderError, parseIdempotencyKey } from './header.js';
import { HttpProblem, PROBLEM_BASE, parseJsonBody, problem } from './responses.js';
import { engineOptions } from './engine.js';

export const DEFAULT_BODY_LIMIT = 1024 * 1024;

/** The options of idempotency()/transactional() and the adapters, checked once. */
export function frontOptions(options) {
  const {
    scope = () => '',
    problemBase = PROBLEM_BASE,
    bodyLimit = DEFAULT_BODY_LIMIT,
    logger = console,
    requestPath = null,
    methods = null,
  } = options || {};
  if (typeof scope !== 'function') throw new TypeError('idempotency: options.scope must be a function');
  if (!Number.isInteger(bodyLimit) || bodyLimit < 0) throw new TypeError('idempotency: bodyLimit must be a byte count');
  return {
    ...engineOptions(options),
    scope,
    problemBase,
    bodyLimit,
    logger,
    requestPath,
    methods: methods && new Set(methods.map((m) => String(m).toUpperCase())),
  };
}

export function internalError(cfg, detail) {
  return problem(500, 'internal-error', 'Internal Server Error', detail, [], cfg.problemBase);
}

export function badBody(cfg) {
  return problem(400, 'request-body-not-json', 'Malformed request body', 'the request body is not JSON', [],
    cfg.problemBase);
}

export function bodyTooLarge(cfg) {
  return problem(413, 'request-too-large', 'Request body too large',
    `the request body is over ${cfg.bodyLimit} bytes`, [], cfg.problemBase);
}

/** 409 when 40001/40P01 kept coming back (or cannot be retried because the handler already ran downstream). */
export function conflict(cfg) {
  return problem(409, 'transaction-conflict', 'Conflict',
    'the request kept conflicting with concurrent requests; retry it', [['Retry-After', '1']], cfg.problemBase);
}

/**
 * Everything before the database. `args`: {scopeArg (what scope() is called with), keyHeader (the raw field
 * value), method, path, readRaw() -> Promise<Buffer> (may throw HttpProblem 413)}, useClaim. Resolves with
 * {answer} (a CapturedResponse to send at once) or {ctx: {scope, key, method, path, raw, bodyText, bodyValue}}.
 */
export async function admit(cfg, args, useClaim) {
  let scopeValue;
  try {
    scopeValue = await cfg.scope(args.scopeArg);
  } catch (e) {
    if (e instanceof HttpProblem) return { answer: e.response };
    throw e;
  }
  if (scopeValue === undefined || scopeValue === null) scopeValue = '';
  const ctx = { scope: String(scopeValue), key: null, method: args.method, path: args.path };
  if (useClaim) {
    try {
      ctx.key = parseIdempotencyKey(args.keyHeader);
    } catch (e) {
      if (!(e instanceof KeyHeaderError)) throw e;
      const title = e.missing ? 'Idempotency-Key required' : 'Invalid Idempotency-Key';
      return { answer: problem(400, e.slug, title, e.message, [], cfg.problemBase) };
    }
  }
  try {
    ctx.raw = await args.readRaw();
  } catch (e) {
    if (e instanceof HttpProblem) return { answer: e.response };
    throw e;
  }
  if (ctx.raw.length > cfg.bodyLimit) return { answer: bodyTooLarge(cfg) };
  try {
    ({ text: ctx.bodyText, value: ctx.bodyValue } = parseJsonBody(ctx.raw));
  } catch {
    return { answer: badBody(cfg) };
  }
  return { ctx };
}

/** Read a node:http request's body, at most `limit` bytes (else HttpProblem 413). */
export function readStream(req, cfg) {
  const limit = cfg.bodyLimit;
  if (req.readableEnded) return Promise.resolve(Buffer.alloc(0));
  const declared = Number(req.headers['content-length']);
  if (declared > limit) {
    // refused without reading it; the rest is discarded so that the client reads the 413 instead of a reset
    req.resume();
    return Promise.reject(new HttpProblem(413, 'request-too-large', 'Request body too large',
      `the request body is over ${limit} bytes`, [['Connection', 'close']], cfg.problemBase));
  }
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let failed = false;
    req.on('data', (chunk) => {
      if (failed) return;
      size += chunk.length;
      if (size > limit) {
        failed = true;
        reject(new HttpProblem(413, 'request-too-large', 'Request body too large',
          `the request body is over ${limit} bytes`, [['Connection', 'close']], cfg.problemBase));
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
