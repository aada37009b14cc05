"""Lease mode (extension 1.1): a step API for handlers that call something outside the database.

A transactional claim holds a transaction open for the whole request; a handler that calls a payment provider
must not.  :func:`run` leases the key instead (``idem_lease``, committed at once), then runs the steps in order,
each with no transaction open and a heartbeat extending the lease while it runs, and records a recovery point
after each (``idem_checkpoint``, in the same transaction as that step's local writes).  A retry after a crash, or
a takeover after the lease ran out, resumes after the last recovery point with its state.  The holder's calls get
SQLSTATE 55000 once another attempt owns the key: the run stops at once, writes nothing more, and answers 409.

::

    steps = [
        Step("charge_created", action=charge_card, commit=insert_ride),   # state -> state
        Step("receipt_sent", action=send_receipt),
    ]
    response = run(pool, key=key, scope=account, method="POST", path="/rides", body_text=body, steps=steps,
                   finish=lambda conn, ctx: json_response(201, {...}), lease_seconds=30)

``action(ctx)`` runs with no transaction open and returns the new state (a JSON-able dict); ``commit(conn, ctx,
state)`` (optional) runs in the checkpoint's transaction and returns the state to record; ``finish(conn, ctx)``
runs in the completing transaction and returns the :class:`Response`, stored with ``idem_lease_complete``
(a 5xx is not stored: the lease is released, the recovery point kept).  ``ctx`` has ``key``, ``scope``, ``token``,
``state`` (the recovery state so far), ``recovery_point``, ``fencing_number`` (extension 1.2's strictly increasing
number per takeover, ``None`` on 1.1) and ``stop_heartbeat()``.
"""

import json
import logging
import threading
from dataclasses import dataclass, field

import psycopg
from psycopg import errors as pgerrors

from .responses import claim_response, problem, sent_form, stored_form_of

log = logging.getLogger("idempotency_pg")

LEASE_SQL = ("SELECT l.*, l.response_body::text AS body_text, l.response_headers::text AS headers_text "
             "FROM idem_lease(%(key)s::text, idem_hash(jsonb_build_object('method', %(method)s::text, "
             "'path', %(path)s::text, 'body', %(body)s::jsonb)), make_interval(secs => %(lease)s), "
             "%(ttl)s::interval, %(scope)s::text) AS l")
EXTEND_SQL = "SELECT idem_lease_extend(%s::text, %s::uuid, make_interval(secs => %s), %s::text)"
CHECKPOINT_SQL = "SELECT idem_checkpoint(%s::text, %s::uuid, %s::text, %s::jsonb, %s::text)"
COMPLETE_SQL = ("SELECT idem_lease_complete(%(key)s::text, %(token)s::uuid, %(status)s::int, r.b, "
                "%(headers)s::jsonb, %(scope)s::text), r.b::text FROM (SELECT %(body)s::jsonb AS b) AS r")
RELEASE_SQL = "SELECT idem_lease_release(%s::text, %s::uuid, %s::text)"


@dataclass
class Step:
    name: str  # the recovery point recorded once the step is done
    action: object = None  # action(ctx) -> state, no transaction open
    commit: object = None  # commit(conn, ctx, state) -> state, in the checkpoint's transaction


@dataclass
class LeaseContext:
    key: str
    scope: str
    token: object
    recovery_point: object
    state: dict
    fencing_number: object = None
    attempt_step: str = ""
    _heartbeat: object = field(default=None, repr=False)

    def stop_heartbeat(self):
        if self._heartbeat is not None:
            self._heartbeat.stop()


class _Heartbeat:
    """Extends the lease every ``lease / 3`` seconds on a connection of its own while a step runs."""

    def __init__(self, pool, ctx, lease_seconds):
        self.pool, self.ctx, self.lease = pool, ctx, lease_seconds
        self.done = threading.Event()
        self.lost = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self.done.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()

    def _run(self):
        while not self.done.wait(self.lease / 3.0):
            try:
                with self.pool.connection() as conn:
                    conn.execute(EXTEND_SQL, (self.ctx.key, self.ctx.token, self.lease, self.ctx.scope))
            except pgerrors.ObjectNotInPrerequisiteState:
                self.lost = True  # the step's checkpoint will get 55000 too and stop the run
                return
            except psycopg.Error:
                log.warning("idempotency: lease heartbeat failed", exc_info=True)


def _lost():
    return problem(409, "idempotency-key-in-progress", "Request in progress",
                   "another attempt took this request over; retry later", [("Retry-After", "1")])


def run(pool, *, key, scope, method, path, body_text, steps, finish, lease_seconds=30.0, ttl=None,
        replay_headers=None):
    """Lease the key, run the steps that are not done yet, complete; returns the :class:`Response` to send."""
    with pool.connection() as conn:
        cur = conn.execute(LEASE_SQL, {"key": key, "method": method, "path": path, "body": body_text,
                                       "lease": float(lease_seconds), "ttl": ttl, "scope": scope})
        row = dict(zip([d.name for d in cur.description], cur.fetchone()))
    if row["outcome"] != "claimed":
        return claim_response(row["outcome"], row["http_status"], row["body_text"], row["headers_text"])
    ctx = LeaseContext(key, scope, row["lease_token"], row["recovery_point"], dict(row["recovery_state"] or {}),
                       row.get("fencing_number"))
    names = [s.name for s in steps]
    start = names.index(ctx.recovery_point) + 1 if ctx.recovery_point in names else 0
    try:
        for step in steps[start:]:
            ctx.attempt_step = step.name
            state = ctx.state
            if step.action is not None:
                with _Heartbeat(pool, ctx, lease_seconds) as hb:
                    ctx._heartbeat = hb
                    state = step.action(ctx)
                ctx._heartbeat = None
            with pool.connection() as conn:
                with conn.transaction():
                    _fence(conn, ctx, lease_seconds)
                    if step.commit is not None:
                        state = step.commit(conn, ctx, state)
                    conn.execute(CHECKPOINT_SQL, (key, ctx.token, step.name, json.dumps(state), scope))
            ctx.state, ctx.recovery_point = state, step.name
        with pool.connection() as conn:
            with conn.transaction():
                _fence(conn, ctx, lease_seconds)
                response = finish(conn, ctx)
                if 500 <= response.status <= 599:
                    stored = stored_form_of(response, replay_headers)
                    conn.execute(COMPLETE_SQL, {"key": key, "token": ctx.token, "status": response.status,
                                                "body": stored.body, "headers": stored.headers, "scope": scope})
                    return response  # not stored: the lease is released, the recovery point kept
                stored = stored_form_of(response, replay_headers)
                out = conn.execute(COMPLETE_SQL, {"key": key, "token": ctx.token, "status": response.status,
                                                  "body": stored.body, "headers": stored.headers,
                                                  "scope": scope}).fetchone()
                stored.read_back = out[1]
        return sent_form(response, stored)
    except pgerrors.ObjectNotInPrerequisiteState:
        log.info("idempotency: lease of %r lost at step %s", key, ctx.attempt_step)
        return _lost()
    except BaseException:
        _release(pool, ctx)
        raise


def _fence(conn, ctx, lease_seconds):
    """First in a step's transaction: the token is still the key's (else 55000, before any local write), and the
    key's row stays locked by this transaction until it commits, so no takeover can slip in before the checkpoint
    or the completion."""
    conn.execute(EXTEND_SQL, (ctx.key, ctx.token, float(lease_seconds), ctx.scope))


def _release(pool, ctx):
    try:
        with pool.connection() as conn:
            conn.execute(RELEASE_SQL, (ctx.key, ctx.token, ctx.scope))
    except psycopg.Error:
        pass  # stale (55000) or the database is gone: the lease runs out on its own


__all__ = ["LeaseContext", "Step", "run"]
