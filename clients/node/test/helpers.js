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
 * answer other statements (return undefined for the default). Every statement is recorded in `log`. Its clients
 * are pipelined (`pipeline: true`, so the middleware sends BEGIN and the claim as two statements) unless
 * `script.pipeline` is false: then the middleware sends one multi-statement message, answered with an array.
 */
export function fakePool(script = {}) {
  const log = [];
  const pool = {
    log,
    connects: 0,
    released: [],
    async connect() {
      pool.connects++;
      const client = {
        pipeline: script.pipeline !== false,
        on() {},
        removeListener() {},
        release(err) {
          pool.released.push(err);
        },
        async query(sql, params) {
          let name;
          if (typeof sql === 'object') ({ text: sql, values: params, name } = sql);
          log.push(name ? { sql, params, name } : { sql, params });
          if (!params && /^(BEGIN[^;]*; SELECT (c\.outcome|idem_claim_request)|SELECT idem_complete.*; COMMIT$)/s.test(sql)) {
            // one simple-query message of two statements (the values are literals in the text)
            const [first, second] = sql.startsWith('BEGIN') ? [sql.split('; ')[0], 'claim'] : ['complete', 'COMMIT'];
            const r1 = first === 'complete' ? await client.query(sql.slice(0, sql.lastIndexOf('; COMMIT')))
              : await client.query(first);
            const r2 = second === 'claim' ? await client.query(sql.slice(sql.indexOf('; ') + 2)) : await client.query('COMMIT');
            log.splice(log.length - 3, 3, { sql, params, multi: true });
            return [r1, r2];
          }
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
            const body = params ? params[2] : (/FROM \(SELECT (E?'.*')::jsonb AS body\)/s.exec(sql) || [])[1];
            const text = body === null || body === undefined || body === 'NULL' ? null
              : jsonbText(params ? body : body.replace(/^E?'|'$/g, '').replace(/''/g, "'"));
            return { command: 'SELECT', rows: [{ stored: true, body: text }] };
          }
          return { command: 'SELECT', rows: [] };
        },
      };
      return client;
    },
  };
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
  return log.map(({ sql, multi }) => {
    if (multi) return sql.startsWith('BEGIN') ? 'BEGIN+claim' : 'complete+COMMIT';
    if (sql.includes('idem_claim')) return 'claim';
    if (sql.includes('idem_complete')) return 'complete';
    return sql;
  });
}

export const quietLogger = { error() {}, info() {}, warn() {}, log() {} };
