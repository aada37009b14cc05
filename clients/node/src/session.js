// One protected request for the adapters that hand the request on to the framework (Koa, Fastify): open (connect,
// BEGIN + claim, retried on 40001/40P01 while nothing ran yet), then close with the response the framework is about
// to send (complete + COMMIT, or ROLLBACK). The handler cannot be run again from here, so a 40001 after it ran is
// answered 409 with Retry-After.

import { BadBody, begin, commit, connect, isRetryable, rollback, sqlstate } from './engine.js';
import { badBody, conflict, internalError } from './request.js';

/**
 * Resolves with {answer} (send it: replay, mismatch, in_progress, 400, 409, 500) or {session} whose `client` runs
 * the handler's statements and whose `close(captured)` resolves with the response to send.
 */
export async function openSession(cfg, ctx) {
  let conn;
  try {
    conn = await connect(cfg);
  } catch (e) {
    cfg.logger.error('idempotency: cannot connect to the database:', e.message);
    return { answer: internalError(cfg, 'the database is unavailable; retry the request') };
  }
  const claim = { ...ctx, problemBase: cfg.problemBase };
  for (let attemptNo = 0; ; attemptNo++) {
    let early;
    try {
      early = await begin(cfg, conn.client, claim);
    } catch (e) {
      const ok = await rollback(conn.client);
      if (ok && isRetryable(e) && attemptNo < cfg.maxRetries) continue;
      conn.release(ok ? undefined : e);
      if (e instanceof BadBody) return { answer: badBody(cfg) };
      if (isRetryable(e)) return { answer: conflict(cfg) };
      cfg.logger.error(`idempotency: the claim failed: ${sqlstate(e) || ''} ${e.message}`);
      return { answer: internalError(cfg, 'the claim failed; retry the request') };
    }
    if (early) {
      conn.release();
      return { answer: early };
    }
    break;
  }

  let closed = false;
  const session = {
    client: conn.client,
    notExecuted: false,
    /**
     * Store and COMMIT `captured` (a status below 500 and not "not executed"), or ROLLBACK. Resolves with the
     * response to send: `captured` (its JSON body in the stored form) or a problem when the COMMIT failed.
     */
    async close(captured) {
      if (closed) return captured;
      closed = true;
      if (captured.status >= 500 || session.notExecuted) {
        const ok = await rollback(conn.client);
        conn.release(ok ? undefined : new Error('ROLLBACK failed'));
        return captured;
      }
      try {
        const answer = await commit(cfg, conn.client, claim, captured);
        conn.release();
        return answer;
      } catch (e) {
        const ok = await rollback(conn.client);
        conn.release(ok ? undefined : e);
        if (isRetryable(e)) return conflict(cfg);
        cfg.logger.error(`idempotency: request rolled back: ${sqlstate(e) || ''} ${e.message}`);
        return internalError(cfg, 'the request failed and was rolled back');
      }
    },
    /** ROLLBACK and release (a thrown error, an aborted request). */
    async abort(err) {
      if (closed) return;
      closed = true;
      const ok = await rollback(conn.client);
      conn.release(ok ? undefined : err || new Error('ROLLBACK failed'));
    },
  };
  return { session };
}

/** The handle handlers get (req.idempotency, ctx.idempotency, request.idempotency). */
export function handle(session, ctx) {
  return {
    client: session.client,
    key: ctx.key,
    scope: ctx.scope,
    attempt: 0,
    /** Answer without executing (validation before any write): rolled back, not stored, the key released. */
    notExecuted() {
      session.notExecuted = true;
    },
  };
}
