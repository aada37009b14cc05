// Holding back an Express (node:http) response: the handler writes to `res` as usual, and every byte and header it
// produces is kept in memory until the middleware decides what to send (after COMMIT, or a rollback).

import { CapturedResponse, wireHeaders } from './responses.js';

const METHODS = ['writeHead', 'write', 'end', 'flushHeaders'];

function toBuffer(chunk, encoding) {
  if (chunk === undefined || chunk === null) return null;
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return Buffer.from(String(chunk), typeof encoding === 'string' ? encoding : 'utf8');
}

function rawHeaders(res) {
  return res.getRawHeaderNames().map((name) => [name, res.getHeader(name)]);
}

/**
 * Patch `res` so that writeHead/write/end are buffered. `begin()` starts one attempt of the handler and returns
 * {done: Promise<CapturedResponse>, ended()}; calls while no attempt is running are dropped. `restore()` puts the
 * original methods back and the headers as they were before the handler ran.
 */
export function interceptResponse(res) {
  const saved = METHODS.map((m) => [m, Object.prototype.hasOwnProperty.call(res, m), res[m]]);
  const initial = { statusCode: res.statusCode, statusMessage: res.statusMessage, headers: rawHeaders(res) };
  let current = null;

  function resetState() {
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    for (const [name, value] of initial.headers) res.setHeader(name, value);
    res.statusCode = initial.statusCode;
    res.statusMessage = initial.statusMessage;
  }

  res.writeHead = function writeHead(statusCode, reason, headers) {
    if (!current) return res;
    if (typeof reason !== 'string') {
      headers = reason;
      reason = undefined;
    }
    res.statusCode = statusCode;
    if (reason !== undefined) res.statusMessage = reason;
    if (Array.isArray(headers)) {
      const pairs = Array.isArray(headers[0]) ? headers : [];
      if (!Array.isArray(headers[0])) for (let i = 0; i + 1 < headers.length; i += 2) pairs.push([headers[i], headers[i + 1]]);
      for (const [k, v] of pairs) res.appendHeader(k, v);
    } else if (headers) {
      for (const [k, v] of Object.entries(headers)) if (v !== undefined) res.setHeader(k, v);
    }
    return res;
  };
  res.flushHeaders = function flushHeaders() {};
  res.write = function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') [cb, encoding] = [encoding, undefined];
    if (current && !current.isEnded) {
      const buf = toBuffer(chunk, encoding);
      if (buf) current.chunks.push(buf);
    }
    if (typeof cb === 'function') process.nextTick(cb);
    return true;
  };
  res.end = function end(chunk, encoding, cb) {
    if (typeof chunk === 'function') [cb, chunk, encoding] = [chunk, undefined, undefined];
    if (typeof encoding === 'function') [cb, encoding] = [encoding, undefined];
    if (current && !current.isEnded) {
      const buf = toBuffer(chunk, encoding);
      if (buf) current.chunks.push(buf);
      current.isEnded = true;
      current.resolve(new CapturedResponse(res.statusCode, rawHeaders(res), Buffer.concat(current.chunks)));
    }
    if (typeof cb === 'function') process.nextTick(cb);
    return res;
  };

  return {
    begin() {
      resetState();
      const attempt = { chunks: [], isEnded: false };
      attempt.done = new Promise((resolve) => {
        attempt.resolve = resolve;
      });
      current = attempt;
      return attempt;
    },
    finish() {
      current = null;
    },
    restore() {
      current = null;
      for (const [m, own, fn] of saved) {
        if (own) res[m] = fn;
        else delete res[m];
      }
      resetState();
    },
  };
}

/** Send `answer` (a CapturedResponse) on a response whose methods are not (or no longer) intercepted. */
export function sendResponse(res, answer) {
  if (res.headersSent || res.writableEnded) return;
  res.statusCode = answer.status;
  for (const [k, v] of wireHeaders(answer)) res.setHeader(k, v);
  res.end(answer.body);
}
