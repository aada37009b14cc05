// The database side of the middleware, shared by every framework adapter (Express, Koa, Fastify): the claim opened
// with BEGIN, the completion sent with COMMIT, rollback and release. Knows nothing about HTTP frameworks.
//
// Round trips. A protected request costs what a bare transactional handler costs (BEGIN ..., the handler's
// statements, ... COMMIT): BEGIN travels with the claim and idem_complete with COMMIT, either
// - 'pipeline': when the pg client was made with `pipeline: true` (node-postgres 8.23+), both statements are
//   queued without waiting, so they leave in one write and come back in one read; or
// - 'multi': one simple-query message holding both statements, its values written as SQL literals (simple query
//   has no parameters). Works with any node-postgres and through PgBouncer in transaction pooling mode.
// 'auto' (the default) picks 'pipeline' on a pipelined client and 'multi' otherwise; 'off' sends each statement
// on its own (five round trips), kept for the benchmark.

import { CapturedResponse, claimResponse, storedForm } from './responses.js';

// No `name` is ever passed to client.query: node-postgres then uses the unnamed statement, which does not outlive
// the transaction, so this works through PgBouncer in transaction pooling mode.
const CLAIM_SELECT = (key, method, path, body, ttl, scope) =>
  'SELECT c.outcome, c.http_status, c.response_body::text AS response_body, ' +
  'c.response_headers::text AS response_headers ' +
  `FROM idem_claim(${key}::text, ` +
  `idem_hash(jsonb_build_object('method', ${method}::text, 'path', ${path}::text, 'body', ${body}::jsonb)), ` +
  `${ttl}::interval, ${scope}::text) AS c`;
// The stored JSON body comes back as jsonb's text: that text is what the first answer sends, so a replay (which
// sends the stored jsonb) is byte-identical to it.
const COMPLETE_SELECT = (key, status, body, headers, scope) =>
  `SELECT idem_complete(${key}::text, ${status}::int, v.body, ${headers}::jsonb, ${scope}::text) AS stored, ` +
  `v.body::text AS body FROM (SELECT ${body}::jsonb AS body) AS v`;

export const CLAIM_SQL = CLAIM_SELECT('$1', '$2', '$3', '$4', '$5', '$6');
export const COMPLETE_SQL = COMPLETE_SELECT('$1', '$2', '$3', '$4', '$5');

/** SQLSTATEs after which the whole transaction is run again. */
export const RETRYABLE = new Set(['40001', '40P01']);
/** SQLSTATEs of the claim statement that mean the request body is not JSON that PostgreSQL accepts. */
const BAD_BODY = new Set(['22P02', '22P05', '22003']);
const ISOLATION = new Set(['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']);
const BATCHING = new Set(['auto', 'pipeline', 'multi', 'off']);

export class BadBody extends Error {}
export class TransactionAborted extends Error {}

export function sqlstate(err) {
  return err && (err.code || (err.cause && err.cause.code));
}

export function isRetryable(err) {
  return RETRYABLE.has(sqlstate(err));
}

/**
 * A SQL literal for a simple-query message: 'text' with quotes doubled, or E'...' when it holds a backslash (so it
 * means the same whatever standard_conforming_strings is). NUL cannot be sent in a query at all.
 */
export function sqlLiteral(value) {
  if (value === null || value === undefined) return 'NULL';
  const s = String(value);
  if (s.includes('\0')) throw new TypeError('a value sent to PostgreSQL cannot contain a NUL character');
  const quoted = `'${s.replace(/'/g, "''")}'`;
  return s.includes('\\') ? `E${quoted.replace(/\\/g, '\\\\')}` : quoted;
}

/** Run queries on `client`, all written before the first answer is read; rejects with the first error. */
export async function pipelined(client, texts, params) {
  const results = await Promise.allSettled(texts.map((t, i) => client.query(t, params[i])));
  const failed = results.find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
  return results.map((r) => r.value);
}

function noop() {}

/** Options shared by every adapter, checked once. */
export function engineOptions(options) {
  const {
    pool,
    ttl = null,
    maxRetries = 3,
    replayHeaders = null,
    isolationLevel = null,
    batching = 'auto',
  } = options || {};
  if (!pool || typeof pool.connect !== 'function') throw new TypeError('idempotency: options.pool (a pg.Pool) is required');
  if (isolationLevel !== null && !ISOLATION.has(String(isolationLevel).toUpperCase())) {
    throw new TypeError(`idempotency: unknown isolationLevel ${isolationLevel}`);
  }
  if (!BATCHING.has(batching)) throw new TypeError(`idempotency: batching must be one of ${[...BATCHING].join(', ')}`);
  if (!Number.isInteger(maxRetries) || maxRetries < 0) throw new TypeError('idempotency: maxRetries must be an integer >= 0');
  return {
    pool,
    ttl,
    maxRetries,
    replayHeaders,
    batching,
    beginSql: isolationLevel ? `BEGIN ISOLATION LEVEL ${String(isolationLevel).toUpperCase()}` : 'BEGIN',
  };
}

/** How `client` sends a pair of statements: 'pipeline', 'multi' or 'off'. */
function modeOf(opts, client) {
  if (opts.batching !== 'auto') return opts.batching;
  return client.pipeline === true ? 'pipeline' : 'multi';
}

/** Take a connection from the pool; `release(err)` gives it back (dropped when err is set). */
export async function connect(opts) {
  const client = await opts.pool.connect();
  client.on('error', noop); // a lost connection also fails the query in progress
  return {
    client,
    release(err) {
      client.removeListener('error', noop);
      client.release(err || undefined);
    },
  };
}

/**
 * BEGIN and, when `claim` is given ({key, method, path, bodyText, scope}), idem_claim in the same round trip.
 * Resolves with the early answer (replay, mismatch, in_progress: already rolled back) or null (claimed: the
 * transaction is open). Throws BadBody when PostgreSQL refuses the body as jsonb; other errors as they are (the
 * caller rolls back).
 */
export async function begin(opts, client, claim) {
  if (!claim) {
    await client.query(opts.beginSql);
    return null;
  }
  const mode = modeOf(opts, client);
  const args = [claim.key, claim.method, claim.path, claim.bodyText, opts.ttl, claim.scope];
  let row;
  try {
    if (mode === 'multi') {
      const results = await client.query(`${opts.beginSql}; ${CLAIM_SELECT(...args.map(sqlLiteral))}`);
      row = results[1].rows[0];
    } else if (mode === 'pipeline') {
      row = (await pipelined(client, [opts.beginSql, CLAIM_SQL], [undefined, args]))[1].rows[0];
    } else {
      await client.query(opts.beginSql);
      row = (await client.query(CLAIM_SQL, args)).rows[0];
    }
  } catch (e) {
    if (BAD_BODY.has(sqlstate(e))) throw new BadBody(e.message);
    throw e;
  }
  const early = claimResponse(row, claim.problemBase);
  if (early) await client.query('ROLLBACK'); // replay, mismatch, in_progress: nothing to keep
  return early;
}

/**
 * Store `captured` with idem_complete (when `claim` is given) and COMMIT, in one round trip. Resolves with the
 * response to send: `captured`, its JSON body replaced by the stored (jsonb) text so that a replay is the same
 * bytes. Throws when the completion or the COMMIT fails (the caller rolls back).
 */
export async function commit(opts, client, claim, captured) {
  if (!claim) {
    const done = await client.query('COMMIT');
    if (done.command !== 'COMMIT') throw new TransactionAborted('the transaction was aborted by an earlier error');
    return captured;
  }
  const stored = storedForm(captured, opts.replayHeaders);
  const args = [claim.key, captured.status, stored.body, stored.headers, claim.scope];
  const mode = modeOf(opts, client);
  let row;
  let done;
  if (mode === 'multi') {
    [{ rows: [row] }, done] = await client.query(`${COMPLETE_SELECT(...args.map(sqlLiteral))}; COMMIT`);
  } else if (mode === 'pipeline') {
    [{ rows: [row] }, done] = await pipelined(client, [COMPLETE_SQL, 'COMMIT'], [args, undefined]);
  } else {
    ({ rows: [row] } = await client.query(COMPLETE_SQL, args));
    done = await client.query('COMMIT');
  }
  // COMMIT of a transaction that an earlier (swallowed) error aborted answers ROLLBACK.
  if (done.command !== 'COMMIT') throw new TransactionAborted('the transaction was aborted by an earlier error');
  if (stored.json && row && typeof row.body === 'string') {
    return new CapturedResponse(captured.status, captured.headers, Buffer.from(row.body, 'utf8'));
  }
  return captured;
}

/** ROLLBACK; false when the connection is broken (then it must be released with an error: the pool drops it). */
export async function rollback(client) {
  try {
    await client.query('ROLLBACK');
    return true;
  } catch {
    return false;
  }
}
