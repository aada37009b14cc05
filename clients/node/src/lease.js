// Lease mode (extension 1.1+): a step API for handlers that call something outside the database (a payment
// provider, a mailer) and so must not hold a transaction open for the whole request.
//
// runLease() leases the key (idem_lease, autocommit: committed at once), then runs the steps after the recovery
// point the key has reached. While a step runs, a heartbeat extends the lease every third of its length on a
// connection of its own. A step does its outside call with no transaction open, then its local writes in
// ctx.transaction(fn), which records the step's recovery point and ctx.state (idem_checkpoint) in that same
// transaction, so the writes and the checkpoint commit together or not at all. `finish` builds the response in the
// completing transaction, which stores it: on 1.3 as the bytes sent (idem_lease_complete_request), replayed byte for
// byte; on 1.1-1.2 as jsonb (idem_lease_complete), sent as stored.
//
// Every transaction of the holder starts with idem_lease_extend: a holder whose lease ran out and was taken over
// gets SQLSTATE 55000 there, before any local write of its own. 55000 from any holder call stops the run at once
// (nothing more is written) and it answers 409; the step sees a LeaseLostError. Any other failure gives the lease
// back (idem_lease_release, the recovery point kept) and is rethrown; the retry resumes after the last recorded
// step. The same semantics as the Go lease.Runner and Python's idempotency_pg.lease.run.

import {
  CapturedResponse, PROBLEM_BASE, answerHeaders, problem, renderAnswer, requestClaimResponse, storeOptions, storedBytes, storedForm, toStore,
} from './responses.js';
import { batch, batchCommit, rollback, sentForm, sqlstate } from './engine.js';

/** SQLSTATE object_not_in_prerequisite_state: the token is not the key's current one any more. */
export const LEASE_LOST = '55000';

const HASH_OF_REQUEST = "idem_hash(jsonb_build_object('method', $2::text, 'path', $3::text, 'body', $4::jsonb))";
// `l.*` and not a column list: 1.2 adds the trailing column fencing_number, 1.3 response_content_type and
// response_bytes (then idem_lease_complete_request is there too), 1.1 has none; all are read by name. The jsonb
// columns come back as text too, as the middleware's claim reads them.
const LEASE_SELECT = (hash, n) =>
  'SELECT l.*, l.response_body::text AS idem_body_text, l.response_headers::text AS idem_headers_text ' +
  `FROM idem_lease($1::text, ${hash}, make_interval(secs => $${n}::float8), $${n + 1}::interval, ` +
  `$${n + 2}::text) AS l`;
export const LEASE_SQL = LEASE_SELECT(HASH_OF_REQUEST, 5);
const LEASE_BY_HASH_SQL = LEASE_SELECT('$2::text', 3);
export const EXTEND_SQL = 'SELECT idem_lease_extend($1::text, $2::uuid, make_interval(secs => $3::float8), $4::text)';
export const CHECKPOINT_SQL = 'SELECT idem_checkpoint($1::text, $2::uuid, $3::text, $4::jsonb, $5::text)';
// 1.1-1.2: the body is read back as jsonb's text: that text is what the first answer sends, so a replay (which
// sends the stored jsonb) is the same bytes.
export const LEASE_COMPLETE_SQL =
  'SELECT idem_lease_complete($1::text, $2::uuid, $3::int, v.body, $5::jsonb, $6::text) AS stored, ' +
  'v.body::text AS body FROM (SELECT $4::jsonb AS body) AS v';
// 1.3: the bytes sent, with their content type, stored as they are (no read-back); as the engine's COMPLETE_REQUEST_SQL.
export const LEASE_COMPLETE_REQUEST_SQL = 'SELECT idem_lease_complete_request($1, $2, $3, $4, $5, $6, $7) AS stored';
export const RELEASE_SQL = 'SELECT idem_lease_release($1::text, $2::uuid, $3::text)';

/**
 * The lease of this run was taken over (SQLSTATE 55000 from a holder call, or the heartbeat saw it): stop, write
 * nothing more. Thrown into the step by ctx.transaction() and ctx.signal; runLease() answers it with 409.
 */
export class LeaseLostError extends Error {
  constructor(key, cause) {
    super(`idempotency: the lease of key ${JSON.stringify(key)} was taken over by another attempt` +
      (cause && cause.message ? ` (${cause.message})` : ''), cause ? { cause } : undefined);
    this.name = 'LeaseLostError';
    this.code = LEASE_LOST;
    this.key = key;
  }
}

function asLost(err, key) {
  if (err instanceof LeaseLostError) return err;
  return sqlstate(err) === LEASE_LOST ? new LeaseLostError(key, err) : err;
}

function stepName(step, i) {
  if (!step || typeof step !== 'object') throw new TypeError(`runLease: steps[${i}] must be {name, run}`);
  const { name } = step;
  if (typeof name !== 'string' || name === '' || Buffer.byteLength(name) > 255) {
    throw new TypeError(`runLease: steps[${i}].name must be a non-empty string of at most 255 bytes (a recovery point)`);
  }
  if (typeof step.run !== 'function') throw new TypeError(`runLease: steps[${i}].run must be a function`);
  return name;
}

/** The options of runLease(), checked before anything is sent to the database. */
function leaseOptions(pool, key, options) {
  if (!pool || typeof pool.connect !== 'function' || typeof pool.query !== 'function') {
    throw new TypeError('runLease: pool must be a pg.Pool');
  }
  if (typeof key !== 'string' || key === '') throw new TypeError('runLease: key must be a non-empty string');
  const {
    scope = '', method = 'POST', path, body, requestHash, steps = [], finish, leaseSeconds = 30, heartbeatMs, ttl = null,
    replayHeaders = null, problemBase = PROBLEM_BASE, logger = console, renderProblem = null, redact = null, storeBody = true,
  } = options || {};
  if (renderProblem !== null && typeof renderProblem !== 'function') throw new TypeError('runLease: options.renderProblem must be a function');
  const store = storeOptions({ redact, storeBody });
  if (typeof scope !== 'string') throw new TypeError('runLease: options.scope must be a string');
  if (!Array.isArray(steps)) throw new TypeError('runLease: options.steps must be an array of {name, run}');
  const names = steps.map(stepName);
  const dup = names.find((n, i) => names.indexOf(n) !== i);
  if (dup !== undefined) throw new TypeError(`runLease: two steps are named ${JSON.stringify(dup)}`);
  if (typeof finish !== 'function') throw new TypeError('runLease: options.finish (client, ctx) => response is required');
  if (typeof leaseSeconds !== 'number' || !(leaseSeconds > 0) || leaseSeconds > 365 * 86400) {
    throw new TypeError('runLease: options.leaseSeconds must be a number of seconds > 0 (at most 365 days)');
  }
  const beat = heartbeatMs ?? (leaseSeconds * 1000) / 3;
  if (typeof beat !== 'number' || !(beat > 0) || beat >= leaseSeconds * 1000) {
    throw new TypeError('runLease: options.heartbeatMs must be > 0 and shorter than the lease');
  }
  if (ttl !== null && typeof ttl !== 'string') throw new TypeError("runLease: options.ttl must be interval text ('24 hours') or null");
  let hashArgs;
  if (requestHash !== undefined && requestHash !== null) {
    // the extension's request_hash: a SHA-256 as hex (what idem_hash returns)
    if (typeof requestHash !== 'string' || !/^[0-9a-fA-F]{64}$/.test(requestHash)) {
      throw new TypeError('runLease: options.requestHash must be 64 hexadecimal digits (a SHA-256, as idem_hash returns)');
    }
    hashArgs = [requestHash];
  } else {
    if (typeof path !== 'string' || typeof method !== 'string') {
      throw new TypeError('runLease: options.path and options.method (or options.requestHash) are required');
    }
    const text = Buffer.isBuffer(body) ? body.toString('utf8') : body;
    try {
      if (typeof text !== 'string') throw new TypeError();
      JSON.parse(text);
    } catch {
      throw new TypeError('runLease: options.body must be the request body as JSON text (or give options.requestHash)');
    }
    hashArgs = [method, path, text];
  }
  return {
    pool, key, scope, steps, names, finish, leaseSeconds, heartbeatMs: beat, ttl, replayHeaders, problemBase, logger,
    hashArgs, renderProblem, store,
  };
}

/** Extends the lease every `heartbeatMs` on a pooled connection of its own, one call at a time. */
class Heartbeat {
  constructor(cfg, ctx, onLost) {
    Object.assign(this, { cfg, ctx, onLost, paused: false, lost: false, stopped: false, inflight: null, timer: null });
  }

  schedule() {
    if (this.stopped || this.lost) return;
    this.timer = setTimeout(() => {
      this.inflight = this.beat().finally(() => {
        this.inflight = null;
        this.schedule();
      });
    }, this.cfg.heartbeatMs);
    this.timer.unref?.(); // never keeps a process alive on its own
  }

  async beat() {
    if (this.paused) return;
    const { cfg, ctx } = this;
    try {
      await cfg.pool.query(EXTEND_SQL, [ctx.key, ctx.token, cfg.leaseSeconds, ctx.scope]);
    } catch (e) {
      if (sqlstate(e) === LEASE_LOST) {
        this.lost = true;
        this.onLost(new LeaseLostError(ctx.key, e));
      } else if (!this.stopped) {
        cfg.logger.error(`idempotency: lease heartbeat of key ${JSON.stringify(ctx.key)} failed: ${e.message}`);
      }
    }
  }

  async stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.inflight;
  }
}

/** What each step (and finish) gets: the lease, the recovery point and state, and its transaction. */
class LeaseContext {
  constructor(cfg, row) {
    this.key = cfg.key;
    this.scope = cfg.scope;
    /** The lease token (uuid text) that authenticates this holder to the extension. */
    this.token = row.lease_token;
    /**
     * The lease's fencing number (extension 1.2: strictly increasing across takeovers of a key) as a BigInt, or
     * null on a 1.1 database. Pass it to systems that can refuse an older holder's writes.
     */
    this.fencingNumber = row.fencing_number === undefined || row.fencing_number === null ? null : BigInt(row.fencing_number);
    /** The last step recorded before the current one (null: none yet). */
    this.recoveryPoint = row.recovery_point ?? null;
    /** The recovery state: what earlier steps recorded (restored on a takeover); a step adds to it. */
    this.state = row.recovery_state && typeof row.recovery_state === 'object' ? row.recovery_state : {};
    /** The step running now (its name is the recovery point it records). */
    this.step = null;
    const abort = new AbortController();
    /** Aborted (reason: a LeaseLostError) when the heartbeat finds the lease taken over: pass it to fetch(). */
    this.signal = abort.signal;
    Object.defineProperty(this, '_run', {
      value: { cfg, abort, heartbeat: null, recorded: false, finished: false },
    });
  }

  /** Stop extending the lease until the current step ends (a stalled holder, in tests). */
  stopHeartbeat() {
    if (this._run.heartbeat) this._run.heartbeat.paused = true;
  }

  /**
   * Run fn(client, ctx) in a transaction that first checks the lease is still this holder's (extending it) and
   * last records the current step with ctx.state (idem_checkpoint): the step's local writes and its recovery
   * point commit together or not at all. Resolves with fn's result; rejects with LeaseLostError when the lease
   * was taken over (fn is then not called, or its writes are rolled back).
   */
  async transaction(fn) {
    const run = this._run;
    if (this.step === null || run.finished) throw new Error('idempotency: ctx.transaction() is only for a running step');
    if (typeof fn !== 'function') throw new TypeError('idempotency: ctx.transaction(fn) needs a function');
    const step = this.step;
    const { result } = await holderTransaction(run.cfg, this, async (client) => {
      const out = await fn(client, this);
      return { result: out, last: checkpointOf(this, step) };
    });
    run.recorded = true;
    return result;
  }
}

/**
 * A holder's transaction in as few round trips as a bare transaction takes (on a pipelined client, see batch()):
 * BEGIN with idem_lease_extend (first: 55000 before any write of a stale holder, and the key's row stays locked by
 * this transaction until it ends, so no takeover slips in before the checkpoint or the completion), then
 * fn(client), then fn's `last` statement (the checkpoint or the completion) with COMMIT. fn resolves with {result,
 * last: [text, params]}; the transaction resolves with {result, row: last's first row}. With `alone` (a step
 * without writes: no fn) the four statements go in one round trip. Rolls back and rethrows (55000 as
 * LeaseLostError) on any failure.
 */
async function holderTransaction(cfg, ctx, fn, alone = null) {
  const run = ctx._run;
  if (run.heartbeat && run.heartbeat.lost) throw new LeaseLostError(ctx.key);
  const client = await cfg.pool.connect();
  const extend = [EXTEND_SQL, [ctx.key, ctx.token, cfg.leaseSeconds, ctx.scope]];
  let broken;
  try {
    if (alone) return { row: (await batchCommit(client, [['BEGIN'], extend, alone]))[2].rows[0] };
    await batch(client, [['BEGIN'], extend]);
    const { result, last } = await fn(client);
    return { result, row: (await batchCommit(client, [last]))[0].rows[0] };
  } catch (e) {
    if (!(await rollback(client))) broken = e; // the pool drops the connection
    throw asLost(e, ctx.key);
  } finally {
    client.release(broken);
  }
}

/** idem_checkpoint of `step` with ctx.state as it is now. */
function checkpointOf(ctx, step) {
  return [CHECKPOINT_SQL, [ctx.key, ctx.token, step, JSON.stringify(ctx.state), ctx.scope]];
}

async function release(cfg, ctx) {
  try {
    await cfg.pool.query(RELEASE_SQL, [ctx.key, ctx.token, ctx.scope]);
  } catch (e) {
    // 55000: not ours any more; anything else: the lease runs out on its own
    if (sqlstate(e) !== LEASE_LOST) cfg.logger.error(`idempotency: releasing the lease of ${JSON.stringify(ctx.key)} failed: ${e.message}`);
  }
}

/** finish() answered a 5xx: its transaction is rolled back and nothing is stored. */
class NotStored extends Error {
  constructor(response) {
    super('a 5xx is not stored');
    this.response = response;
  }
}

/** The completing transaction: finish() builds the response, stored as the engine's commit stores one (a 5xx is not). */
async function complete(cfg, ctx) {
  try {
    let stored = {}; // 1.1-1.2's jsonb form: the answer is sent as stored
    const { result: response, row } = await holderTransaction(cfg, ctx, async (client) => {
      const resp = await cfg.finish(client, ctx);
      if (!resp || !Number.isInteger(resp.status) || !Array.isArray(resp.headers)) {
        throw new TypeError('runLease: finish must return a CapturedResponse (jsonResponse(), problem(), ...)');
      }
      // A 5xx is never stored: finish's writes are undone (as the transactional middleware rolls back a 5xx) and
      // the lease is given back below with the recovery point kept, so that the retry resumes at once.
      if (resp.status >= 500) throw new NotStored(resp);
      // store-less (CONTRACT.md): dropped before the completing statement; the first answer is sent whole
      const kept = toStore(resp, cfg.store);
      const b = cfg.bytes ? storedBytes(kept, cfg.replayHeaders) : (stored = storedForm(kept, cfg.replayHeaders));
      if (kept !== resp) stored.json = false;
      return { result: resp, last: cfg.bytes
        ? [LEASE_COMPLETE_REQUEST_SQL, [ctx.key, ctx.scope, ctx.token, kept.status, b.contentType, b.headers, kept.body]]
        : [LEASE_COMPLETE_SQL, [ctx.key, ctx.token, kept.status, b.body, b.headers, ctx.scope]] };
    });
    const sent = sentForm(response, stored, row);
    // CONTRACT.md key-lifetime (1.4): idem_lease's headers (the key's expiry) on the stored answer, never in the row
    return ctx.answerHeaders.length
      ? new CapturedResponse(sent.status, [...sent.headers, ...ctx.answerHeaders], sent.body)
      : sent;
  } catch (e) {
    if (!(e instanceof NotStored)) throw e;
    await release(cfg, ctx);
    return e.response;
  }
}

/**
 * Lease `key` and run the steps after its recovery point, then `finish`. Resolves with the response to send (a
 * CapturedResponse): the stored one for a replay (Idempotent-Replayed: true), 422 for a mismatch, 409 with
 * Retry-After: 1 for a key in flight or a lease taken over, finish's response otherwise (stored unless a 5xx).
 * Rejects with a step's or finish's error after giving the lease back (the retry resumes after the last step
 * recorded).
 *
 *   options: {scope, method, path, body (JSON text) | requestHash, steps: [{name, run: async (ctx) => ...}],
 *             finish: async (client, ctx) => response, leaseSeconds = 30, heartbeatMs = lease / 3, ttl,
 *             replayHeaders, problemBase, logger}
 */
export async function runLease(pool, key, options) {
  const cfg = leaseOptions(pool, key, options);
  return renderAnswer(await leaseRun(pool, key, cfg), cfg.renderProblem);
}

async function leaseRun(pool, key, cfg) {
  const sql = cfg.hashArgs.length === 1 ? LEASE_BY_HASH_SQL : LEASE_SQL;
  const { rows: [row] } = await pool.query(sql, [key, ...cfg.hashArgs, cfg.leaseSeconds, cfg.ttl, cfg.scope]);
  if (!row) throw new Error('idempotency: idem_lease returned no row');
  cfg.bytes = 'response_bytes' in row;
  if (row.outcome !== 'claimed') {
    // as the engine's 1.3 claim answers: the stored bytes with their type, else (1.1-1.2) jsonb's text of the body
    const body = row.response_bytes ?? (row.idem_body_text === null ? null : Buffer.from(row.idem_body_text));
    return requestClaimResponse([row.outcome, row.http_status, row.response_content_type ?? null, row.idem_headers_text,
      body], cfg.problemBase);
  }
  const ctx = new LeaseContext(cfg, row);
  ctx.answerHeaders = answerHeaders('claimed', row.idem_headers_text);
  ctx.keyExpires = ctx.answerHeaders.find(([k]) => k.toLowerCase() === 'idempotency-key-expires')?.[1] ?? null;
  const run = ctx._run;
  let start = 0;
  if (ctx.recoveryPoint !== null) {
    start = cfg.names.indexOf(ctx.recoveryPoint) + 1;
    if (start === 0) {
      await release(cfg, ctx);
      throw new Error(`idempotency: the recovery point ${JSON.stringify(ctx.recoveryPoint)} of key ` +
        `${JSON.stringify(key)} is no step's name (${cfg.names.join(', ')})`);
    }
  }
  run.heartbeat = new Heartbeat(cfg, ctx, (err) => run.abort.abort(err));
  run.heartbeat.schedule();
  try {
    for (const step of cfg.steps.slice(start)) {
      ctx.step = step.name;
      run.recorded = false;
      await step.run(ctx);
      if (run.heartbeat.lost) throw new LeaseLostError(key);
      if (!run.recorded) {
        // a step without local writes: BEGIN, the fence, its checkpoint and COMMIT in one round trip
        await holderTransaction(cfg, ctx, null, checkpointOf(ctx, step.name));
      }
      run.heartbeat.paused = false;
      ctx.recoveryPoint = step.name;
    }
    ctx.step = null;
    return await complete(cfg, ctx);
  } catch (e) {
    const err = asLost(e, key);
    if (err instanceof LeaseLostError) {
      cfg.logger.info?.(`idempotency: lease of ${JSON.stringify(key)} lost at step ${ctx.step ?? '(finish)'}, stopping`);
      return problem(409, 'idempotency-key-in-progress', 'Request in progress',
        "this request's lease was taken over by another attempt; retry later", [['Retry-After', '1']], cfg.problemBase);
    }
    await release(cfg, ctx);
    throw e;
  } finally {
    run.finished = true;
    ctx.step = null;
    await run.heartbeat.stop();
  }
}
