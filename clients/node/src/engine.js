// The one place where an attempt of a protected request is decided, shared by every framework adapter (Express,
// Koa, Fastify) and by lease mode: parse the key, read the whole body, claim, run the handler, capture its answer,
// complete or roll back. An adapter only translates its framework's request into `execute()`'s input and the
// CapturedResponse it resolves with into its framework's response.
//
// Round trips. BEGIN travels with the claim and the completion with COMMIT. On a client of a pool made with
// `pipeline: true` (node-postgres 8.23+; the sample service's pool) each pair is queued without waiting, so it
// leaves in one write and comes back in one read: the round trips of a bare transactional handler. On any other
// client each statement waits for the one before: the same statements, two round trips more.
//
// Statements. On extension 1.3 the claim is idem_claim_request (the fingerprint computed inside it from the
// request's parts, a replay's stored bytes in the same row) and the completion idem_complete_request (the response
// as the bytes sent: no read-back); on 1.0-1.2 (the first claim answers 42883) idem_claim and idem_complete, with
// the body stored as jsonb and sent as jsonb's text. Both are named prepared statements (`name` in node-postgres'
// query config: parsed once per client connection, then only bound and executed), their names unique to the
// client connection (statementName), so behind a pooler two client connections never prepare one name on a server
// connection. node-postgres parses a name once per client connection, and the claim is the first named statement of
// every transaction: a claim that runs by name runs on the server connection that parsed it, the only one holding
// the name, and so does the completion after it, which was parsed there too (in a transaction whose claim ran by
// name). A pooler that moved the connection to a server connection without the name (PgBouncer before 1.21 in
// transaction pooling: SQLSTATE 26000, or 42P05 for a name already there) is therefore met at the claim, before the
// handler: the attempt is rolled back and run again unnamed, and `prepared: 'auto'` goes on unnamed for good;
// `prepared: false` never names them.

import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { KeyHeaderError, parseIdempotencyKey } from './header.js';
import {
  CapturedResponse, HttpProblem, PROBLEM_BASE, claimResponse, parseJsonBody, parseRecord, problem, renderAnswer,
  answerHeaders, requestClaimResponse, storeOptions, storedBytes, storedForm, toStore,
} from './responses.js';

// 1.0-1.2.
export const CLAIM_SQL =
  'SELECT c.outcome, c.http_status, c.response_body::text AS response_body, ' +
  'c.response_headers::text AS response_headers ' +
  "FROM idem_claim($1::text, idem_hash(jsonb_build_object('method', $2::text, 'path', $3::text, " +
  "'body', $4::jsonb)), $5::interval, $6::text) AS c";
// The stored JSON body comes back as jsonb's text: that text is what the first answer sends, so a replay (which
// sends the stored jsonb) is byte-identical to it.
export const COMPLETE_SQL =
  'SELECT idem_complete($1::text, $2::int, v.body, $4::jsonb, $5::text) AS stored, ' +
  'v.body::text AS body FROM (SELECT $3::jsonb AS body) AS v';
// 1.3: no casts (the functions have no overloads, the server infers each parameter's type); one column each.
export const CLAIM_REQUEST_SQL = 'SELECT idem_claim_request($1, $2, $3, $4, $5, $6, $7, $8) AS c';
export const COMPLETE_REQUEST_SQL = 'SELECT idem_complete_request($1, $2, $3, $4, $5, $6) AS stored';
/** SQLSTATEs of a named statement the pooler's server connection does not hold (or holds already). */
const NOT_PREPARED = new Set(['26000', '42P05']);

export const DEFAULT_BODY_LIMIT = 1024 * 1024;
/** SQLSTATEs after which the whole transaction is run again. */
export const RETRYABLE = new Set(['40001', '40P01']);
/** SQLSTATEs of the claim statement that mean the request body is not JSON that PostgreSQL accepts. */
const BAD_BODY = new Set(['22P02', '22P05', '22003', '22021']);
const ISOLATION = new Set(['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']);

class BadBody extends Error {}
class TransactionAborted extends Error {}
/** Thrown by an adapter's handler run when the client went away before the response: nothing is sent. */
export class ClientGone extends Error {}

export function sqlstate(err) {
  return err && (err.code || (err.cause && err.cause.code));
}

export function isRetryable(err) {
  return RETRYABLE.has(sqlstate(err));
}

/** The HTTP status an error carries (http-errors' `status` or `statusCode` in 400..599), or null. */
export function errorStatus(err) {
  const status = err && (err.status ?? err.statusCode);
  return Number.isInteger(status) && status >= 400 && status <= 599 ? status : null;
}

/**
 * Send `statements` ([[text, params, name], ...]; a statement with a `name` is a named prepared statement) in one
 * round trip on a pipelined client, else one after the other. Resolves with one result per statement; rejects with
 * the first error (the ones after it are not run, or fail in the aborted transaction).
 */
export async function batch(client, statements) {
  const send = ([text, values, name]) => client.query(name ? { name, text, values } : { text, values });
  if (client.pipeline !== true) {
    const results = [];
    for (const statement of statements) results.push(await send(statement));
    return results;
  }
  const results = await Promise.allSettled(statements.map(send));
  const failed = results.find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
  return results.map((r) => r.value);
}

/**
 * batch() of `statements` and COMMIT. COMMIT of a transaction that an earlier (swallowed) error aborted answers
 * ROLLBACK: that rejects with TransactionAborted.
 */
export async function batchCommit(client, statements) {
  const results = await batch(client, [...statements, ['COMMIT']]);
  if (results.at(-1).command !== 'COMMIT') throw new TransactionAborted('the transaction was aborted by an earlier error');
  return results;
}

/** Each client connection's part of its statement names (a client is one connection for its whole life). */
const CONNECTION_IDS = new WeakMap();

/** The name of `statement` on `client`: unique to the client connection, so no other one prepares it. */
export function statementName(client, statement) {
  let id = CONNECTION_IDS.get(client);
  if (!id) CONNECTION_IDS.set(client, (id = randomBytes(6).toString('hex')));
  return `${statement}_${id}`;
}

// The fingerprint's path and query are the request line's (CONTRACT.md, idem_fingerprint): the request target as
// sent, split at its first '?', neither part decoded nor normalised, whatever a framework's routing made of it (a
// mount prefix stripped, a rewritten URL, a '#' that url.parse() takes for a fragment). An empty query (a trailing
// '?') is passed as none (NULL), which idem_fingerprint hashes as it hashes ''.

/** The path of a request target as sent: everything before its first `?`. */
export function pathOf(url) {
  const at = (url || '').indexOf('?');
  return at < 0 ? url || '' : url.slice(0, at);
}

/** The query string of a request target as sent (what follows its first `?`), or null when there is none. */
export function queryOf(url) {
  const at = (url || '').indexOf('?');
  return at < 0 ? null : url.slice(at + 1);
}

/** The options of every adapter, checked once. */
export function options(opts) {
  const {
    pool, ttl = null, maxRetries = 3, replayHeaders = null, isolationLevel = null, scope = () => '',
    problemBase = PROBLEM_BASE, bodyLimit = DEFAULT_BODY_LIMIT, logger = console, requestPath = null, methods = null,
    prepared = 'auto', renderProblem = null, redact = null, storeBody = true,
  } = opts || {};
  if (renderProblem !== null && typeof renderProblem !== 'function') {
    throw new TypeError('idempotency: renderProblem must be a function (problem) => {status, headers, body}');
  }
  if (![true, false, 'auto'].includes(prepared)) throw new TypeError("idempotency: prepared must be true, false or 'auto'");
  if (!pool || typeof pool.connect !== 'function') throw new TypeError('idempotency: options.pool (a pg.Pool) is required');
  if (isolationLevel !== null && !ISOLATION.has(String(isolationLevel).toUpperCase())) {
    throw new TypeError(`idempotency: unknown isolationLevel ${isolationLevel}`);
  }
  if (!Number.isInteger(maxRetries) || maxRetries < 0) throw new TypeError('idempotency: maxRetries must be an integer >= 0');
  if (typeof scope !== 'function') throw new TypeError('idempotency: options.scope must be a function');
  if (!Number.isInteger(bodyLimit) || bodyLimit < 0) throw new TypeError('idempotency: bodyLimit must be a byte count');
  return {
    pool, ttl, maxRetries, replayHeaders, scope, problemBase, bodyLimit, logger, requestPath, renderProblem,
    store: storeOptions({ redact, storeBody }),
    methods: methods && new Set(methods.map((m) => String(m).toUpperCase())),
    // what the database and the pooler allow, learnt from the first answers: the 1.3 statements, named statements
    state: { lean: true, named: prepared !== false, prepared },
    beginSql: isolationLevel ? `BEGIN ISOLATION LEVEL ${String(isolationLevel).toUpperCase()}` : 'BEGIN',
  };
}

export function internalError(cfg, detail) {
  return problem(500, 'internal-error', 'Internal Server Error', detail, [], cfg.problemBase);
}

function badBody(cfg) {
  return problem(400, 'request-body-not-json', 'Malformed request body', 'the request body is not JSON', [],
    cfg.problemBase);
}

/** 409 when 40001/40P01 kept coming back, or came after a handler that cannot be run again. */
function conflict(cfg) {
  return problem(409, 'transaction-conflict', 'Conflict',
    'the request kept conflicting with concurrent requests; retry it', [['Retry-After', '1']], cfg.problemBase);
}

function tooLarge(cfg, limit) {
  return new HttpProblem(413, 'request-too-large', 'Request body too large',
    `the request body is over ${limit} bytes`, [['Connection', 'close']], cfg.problemBase);
}

/**
 * The whole body of `stream` (a node:http request, or a Fastify payload stream), or HttpProblem: 413 at once when
 * `declared` (its Content-Length) is over `limit`, without reading it, or as soon as a chunked body passes the
 * limit (the rest is drained so that the client reads the answer); 400 request-body-unreadable (Go's name) when
 * the stream is aborted, closed or fails before its end, or ends shorter than `declared`. Only a body that
 * arrived whole resolves: a request is never run from part of its body.
 */
export function readBody(stream, cfg, declared, limit = cfg.bodyLimit) {
  const length = declared === undefined || declared === null || declared === '' ? null : Number(declared);
  const incomplete = () => new HttpProblem(400, 'request-body-unreadable', 'Unreadable request body',
    'the request body ended before its Content-Length; nothing was done', [['Connection', 'close']], cfg.problemBase);
  if (length !== null && length > limit) {
    stream.resume();
    return Promise.reject(tooLarge(cfg, limit));
  }
  if (stream.readableEnded) return length ? Promise.reject(incomplete()) : Promise.resolve(Buffer.alloc(0));
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    const settle = (err, body) => {
      stream.removeListener('data', onData);
      stream.removeListener('end', onEnd);
      for (const ev of ['aborted', 'close', 'error']) stream.removeListener(ev, onGone);
      if (err) reject(err);
      else resolve(body);
    };
    function onData(chunk) {
      size += chunk.length;
      if (size > limit) {
        settle(tooLarge(cfg, limit));
        stream.resume();
      } else {
        chunks.push(chunk);
      }
    }
    function onEnd() {
      const body = Buffer.concat(chunks);
      settle(length !== null && body.length !== length ? incomplete() : null, body);
    }
    function onGone() {
      settle(incomplete());
    }
    stream.on('data', onData);
    stream.once('end', onEnd);
    for (const ev of ['aborted', 'close', 'error']) stream.once(ev, onGone);
  });
}

/**
 * Give a node:http request (an IncomingMessage that readBody() read to its end) its body again, as a stream that
 * has not been read: the framework's own body parsers after the middleware (express.json(), express.urlencoded(),
 * multer, koa's co-body, ...) read it as if the middleware had not been there (CONTRACT.md any-body). The
 * request's readable side is started afresh (a new readable state holding `body` and its end), its listeners kept.
 */
export function refill(req, body) {
  if (!req.readableEnded) return;
  Readable.call(req);
  if (body.length > 0) req.push(body);
  req.push(null);
}

/**
 * Everything before the database: the scope, the key, the whole body's bytes. Resolves with an answer to send at
 * once (401 from the scope function, 400, 413), nothing claimed, or the request {scope, key, method, path, query,
 * raw, contentType} (with `input.json`: also bodyText, bodyValue, or 400 when the body is not JSON).
 */
export async function admit(cfg, input) {
  try {
    const scope = (await cfg.scope(input.scopeArg)) ?? '';
    const request = { scope: String(scope), key: null, method: input.method, path: input.path, query: input.query || null };
    if (input.claim !== false) request.key = parseIdempotencyKey(input.keyHeader);
    request.raw = await input.body();
    if (request.raw.length > cfg.bodyLimit) throw tooLarge(cfg, cfg.bodyLimit);
    // CONTRACT.md any-body: the bytes and their Content-Type go to the claim, which fingerprints them; the body is
    // parsed here only for a 1.0-1.2 database (JSON only) or when a caller asks (lease mode's JSON body)
    request.contentType = input.contentType ?? null;
    if (input.json) {
      try {
        ({ text: request.bodyText, value: request.bodyValue } = parseJsonBody(request.raw));
      } catch {
        return badBody(cfg);
      }
    }
    return request;
  } catch (e) {
    if (e instanceof HttpProblem) return e.response;
    if (!(e instanceof KeyHeaderError)) throw e;
    const title = e.missing ? 'Idempotency-Key required' : 'Invalid Idempotency-Key';
    return problem(400, e.slug, title, e.message, [], cfg.problemBase);
  }
}

/** `captured` with its JSON body replaced by the stored (jsonb) text `row.body`, so a replay is the same bytes. */
export function sentForm(captured, stored, row) {
  if (stored.json && row && typeof row.body === 'string') {
    return new CapturedResponse(captured.status, captured.headers, Buffer.from(row.body, 'utf8'));
  }
  return captured;
}

/** `statement`'s name on `client` when the request's statements are named, else undefined (unnamed). */
function nameFor(request, client, statement) {
  return request.named ? statementName(client, statement) : undefined;
}

/**
 * BEGIN, with the claim in the same round trip when the request has a key. Resolves with the claim's answer
 * (replay, mismatch, in_progress: the caller ends the transaction) or null (claimed, or no key: the transaction is
 * open).
 */
async function begin(cfg, client, request) {
  if (request.key === null) {
    await client.query(cfg.beginSql);
    return null;
  }
  // as sent: the completion of this transaction is named only if its claim was
  request.lean = cfg.state.lean;
  request.named = cfg.state.named;
  if (!request.lean && request.bodyText === undefined) {
    // 1.0-1.2 fingerprint JSON only
    try {
      ({ text: request.bodyText, value: request.bodyValue } = parseJsonBody(request.raw));
    } catch {
      throw new BadBody('the request body is not JSON (extension before 1.3)');
    }
  }
  const claim = request.lean
    ? [CLAIM_REQUEST_SQL, [request.key, request.scope, request.method, request.path, request.query,
      request.contentType, request.raw, cfg.ttl], nameFor(request, client, 'idem_claim_request')]
    : [CLAIM_SQL, [request.key, request.method, request.path, request.bodyText, cfg.ttl, request.scope],
      nameFor(request, client, 'idem_claim')];
  let row;
  try {
    [, { rows: [row] }] = await batch(client, [[cfg.beginSql], claim]);
  } catch (e) {
    throw BAD_BODY.has(sqlstate(e)) ? new BadBody(e.message) : e;
  }
  if (!request.lean) return claimResponse(row, cfg.problemBase);
  const fields = parseRecord(row.c);
  // CONTRACT.md key-lifetime (1.4): the claim's headers (the key's expiry) go on the first answer once stored
  request.answerHeaders = fields[0] === 'claimed' ? answerHeaders('claimed', fields[3]) : [];
  return requestClaimResponse(fields, cfg.problemBase);
}

/** The completion (with a key) and COMMIT in one round trip; resolves with the response to send. */
async function commit(cfg, client, request, captured, store = cfg.store) {
  let stored = null;
  const statements = [];
  // store-less (CONTRACT.md): what is dropped never reaches the completing statement; the first answer is sent whole
  const kept = request.key === null ? captured : toStore(captured, store);
  if (request.key !== null && request.lean) {
    // the bytes sent, stored as they are: the first answer needs no read-back
    const b = storedBytes(kept, cfg.replayHeaders);
    statements.push([COMPLETE_REQUEST_SQL, [request.key, request.scope, kept.status, b.contentType, b.headers,
      kept.body], nameFor(request, client, 'idem_complete_request')]);
  } else if (request.key !== null) {
    stored = storedForm(kept, cfg.replayHeaders);
    if (kept !== captured) stored.json = false; // the first answer is sent whole, not as stored
    statements.push([COMPLETE_SQL, [request.key, captured.status, stored.body, stored.headers, request.scope],
      nameFor(request, client, 'idem_complete')]);
  }
  const results = await batchCommit(client, statements);
  const sent = stored ? sentForm(captured, stored, results[0].rows[0]) : captured;
  return withExpiry(sent, request);
}

/** `answer` with the claim's headers (CONTRACT.md key-lifetime: Idempotency-Key-Expires), once it is stored. */
function withExpiry(answer, request) {
  if (!request.answerHeaders || request.answerHeaders.length === 0) return answer;
  return new CapturedResponse(answer.status, [...answer.headers, ...request.answerHeaders], answer.body);
}

/**
 * What an error says about the database and the pooler: the 1.3 statements are missing (42883: go on with 1.0's),
 * or the pooler does not keep named statements (26000, 42P05: go on unnamed, with `prepared: 'auto'`). True when
 * something was learnt, so that the attempt is worth running again.
 */
function learn(cfg, err, request) {
  const code = sqlstate(err);
  const { state } = cfg;
  if (code === '42883' && request.lean && /idem_(claim|complete)_request/.test(err.message)) {
    state.lean = false;
  } else if (NOT_PREPARED.has(code) && request.named && state.prepared === 'auto') {
    state.named = false; // requests already on their way with names learn it from their own error
  } else {
    return false;
  }
  cfg.logger.info?.(`idempotency: SQLSTATE ${code} (${err.message}): going on with ${state.lean ? '1.3' : '1.0'}` +
    ` statements, ${state.named ? 'named' : 'unnamed'}`);
  return true;
}

/** ROLLBACK; false when the connection is broken (then it is released with an error: the pool drops it). */
export async function rollback(client) {
  try {
    await client.query('ROLLBACK');
    return true;
  } catch {
    return false;
  }
}

function noop() {}

/**
 * One protected request. `input`: {scopeArg (what scope() is called with), keyHeader (the raw field value),
 * method, path, body() -> Promise<Buffer> (readBody, or a body parser's bytes), claim (false: no key, no claim,
 * only the transaction), rerun (the handler may be run again on 40001/40P01)}. `run(handle, request)` runs the
 * handler in the transaction and resolves with its CapturedResponse (an HttpProblem thrown is its answer; any
 * other error rolls back and answers 500; ClientGone rolls back and answers nothing); it may set `handle.once`
 * when the handler can no longer be run again. Resolves with the response to send, or null.
 *
 * The flow: admit (scope, key, whole body: answered at once, nothing claimed), BEGIN + claim (replay, mismatch,
 * in_progress answered and rolled back), run, then a 5xx or a not-executed answer rolls back (nothing stored, the
 * key released) and anything else is completed and committed. 40001/40P01 runs the whole transaction again, at
 * most maxRetries times, while the handler may be run again; else 409 Retry-After.
 */
export async function execute(cfg, input, run) {
  return renderAnswer(await attempt(cfg, input, run), cfg.renderProblem);
}

async function attempt(cfg, input, run) {
  const request = await admit(cfg, input);
  if (request instanceof CapturedResponse) return request;
  let client;
  try {
    client = await cfg.pool.connect();
  } catch (e) {
    cfg.logger.error('idempotency: cannot connect to the database:', e.message);
    return internalError(cfg, 'the database is unavailable; retry the request');
  }
  client.on('error', noop); // a lost connection also fails the query in progress
  let broken;
  let ending = null;
  const release = (err) => {
    client.removeListener('error', noop);
    client.release(err);
  };
  try {
    for (let attempt = 0; ; attempt++) {
      let handle = null;
      try {
        const early = await begin(cfg, client, request);
        if (early) {
          ending = client.query('ROLLBACK'); // after the answer: the replay costs no round trip of its own
          return early;
        }
        handle = {
          client, key: request.key, scope: request.scope, attempt, once: input.rerun !== true, skip: false,
          /** Answer without executing (validation before any write): rolled back, not stored, the key released. */
          notExecuted() {
            handle.skip = true;
          },
        };
        let captured;
        try {
          captured = await run(handle, request);
        } catch (e) {
          if (!(e instanceof HttpProblem)) throw e;
          captured = e.response;
        }
        if (captured.problem) captured.problem = null; // the handler's answer: not the middleware's to render
        if (captured.status >= 500 || handle.skip) {
          await client.query('ROLLBACK'); // not cached, the handler's writes undone, the key free again
          return captured;
        }
        return await commit(cfg, client, request, captured, input.store ?? cfg.store);
      } catch (e) {
        if (!(await rollback(client))) broken = e;
        if (e instanceof BadBody) return badBody(cfg);
        if (e instanceof ClientGone) return null;
        const learnt = learn(cfg, e, request);
        if ((learnt || (isRetryable(e) && attempt < cfg.maxRetries)) && !broken && !(handle && handle.once)) {
          cfg.logger.info?.(`idempotency: ${sqlstate(e)} on attempt ${attempt + 1}, running it again`);
          continue;
        }
        if (isRetryable(e) && !broken) return conflict(cfg);
        const code = sqlstate(e);
        if (code) cfg.logger.error(`idempotency: request rolled back: SQLSTATE ${code}: ${e.message}`);
        else cfg.logger.error('idempotency: request rolled back:', e);
        return internalError(cfg, code
          ? `database error (SQLSTATE ${code}); the request was rolled back`
          : 'the request failed and was rolled back');
      }
    }
  } finally {
    if (ending) ending.then(() => release(), release);
    else release(broken);
  }
}

/**
 * execute() for adapters whose framework runs the handler between two hooks (Fastify): resolves with {answer} (send
 * it; nothing is open) or {handle, request, close(captured), abort(err)}: the transaction is open, the handler
 * runs on handle.client, and close/abort resolve with the response to send.
 */
export function open(cfg, input) {
  return new Promise((resolveOpen, rejectOpen) => {
    const answer = execute(cfg, input, (handle, request) => new Promise((resolve, reject) => {
      resolveOpen({
        handle, request,
        close: (captured) => (resolve(captured), answer),
        abort: (err) => (reject(err || new ClientGone('the request ended without a response')), answer),
      });
    }));
    answer.then((a) => resolveOpen({ answer: a }), rejectOpen);
  });
}
