// Test helpers: an HTTP server on an ephemeral loopback port, and a fake pg.Pool that records statements.

import http from 'node:http';

export async function listen(app) {
  const server = http.createServer(app);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    url,
    server,
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
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
    if (/^BEGIN/.test(sql) || sql === 'ROLLBACK') return { command: sql.split(' ')[0], rows: [] };
    if (sql === 'COMMIT') return { command: 'COMMIT', rows: [] };
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
    if (sql.includes('idem_complete')) {
      // the stored body back as jsonb text: the fake normalises like jsonb for plain objects (", " and ": ")
      return { command: 'SELECT', rows: [{ stored: true, body: params[2] === null ? null : jsonbText(params[2]) }] };
    }
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

/** A stand-in for jsonb's text output of `json` (spaces after ':' and ','; keys as given). */
export function jsonbText(json) {
  const out = (v) => {
    if (Array.isArray(v)) return `[${v.map(out).join(', ')}]`;
    if (v && typeof v === 'object') return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${out(x)}`).join(', ')}}`;
    return JSON.stringify(v);
  };
  return out(JSON.parse(json));
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
