// Test helpers: an HTTP server on an ephemeral loopback port, and a fake pg.Pool that records statements.

import http from 'node:http';

export async function listen(app) {
  const server = http.createServer(app);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    url,
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
 * answer other statements (return undefined for the default). Every statement is recorded in `log`.
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
        on() {},
        removeListener() {},
        release(err) {
          pool.released.push(err);
        },
        async query(sql, params) {
          log.push({ sql, params });
          if (script.query) {
            const r = await script.query(sql, params, log);
            if (r !== undefined) return r;
          }
          if (/^BEGIN/.test(sql) || sql === 'ROLLBACK') return { command: sql.split(' ')[0], rows: [] };
          if (sql === 'COMMIT') return { command: 'COMMIT', rows: [] };
          if (sql.includes('idem_claim')) {
            const row = script.claim ? await script.claim(params, log) : undefined;
            return { command: 'SELECT', rows: [row || { outcome: 'claimed', http_status: null, response_body: null, response_headers: null }] };
          }
          if (sql.includes('idem_complete')) return { command: 'SELECT', rows: [{ stored: true }] };
          return { command: 'SELECT', rows: [] };
        },
      };
      return client;
    },
  };
  return pool;
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
