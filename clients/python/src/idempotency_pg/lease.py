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
runs in the completing transaction and returns the :class:`Response`, stored as sent (its bytes and content
type, ``idem_lease_complete_request``, as :mod:`idempotency_pg.core` stores them) and replayed byte for byte
(a 5xx is not stored: that transaction rolls back, finish's writes with it, and the lease is released with the
recovery point kept, so the retry runs ``finish`` again).  ``ctx`` has ``key``, ``scope``, ``token``,
``state`` (the recovery state so far), ``recovery_point``, ``fencing_number`` (extension 1.2's strictly increasing
number per takeover, ``None`` on 1.1) and ``stop_heartbeat()``.

Three ways to run the same steps:

* :func:`run`: a ``psycopg_pool.ConnectionPool``; the heartbeat is a thread with a connection of its own.
* :func:`run_async` (ASGI): a ``psycopg_pool.AsyncConnectionPool``; ``action``, ``commit`` and ``finish`` may be
  coroutine functions (``conn`` is then an ``AsyncConnection``), the heartbeat is an asyncio task.
* :func:`run` with ``idempotency_pg.django.lease_pool()``: Django's own connection, so ``commit`` and ``finish``
  can write with the ORM in the checkpoint's transaction (``transaction.atomic``).

Each step's transaction takes the round trips of a bare ``BEGIN`` / the step's writes / ``COMMIT``: the fence
(``idem_lease_extend``) is sent with ``BEGIN`` and the checkpoint (or the completion) with ``COMMIT``, pipelined
(:class:`idempotency_pg.core.PgTx`), on a psycopg connection in autocommit mode.  The lease statements are not
prepared (one per step).  Django's
connection keeps one statement per round trip: its ``transaction.atomic`` keeps the transaction's state itself
(its autocommit flag, the atomic blocks open), so a BEGIN or COMMIT sent behind its back would leave the ORM writes
of ``commit`` and ``finish`` in a transaction Django does not know it is in.

The steps are written once (:func:`_run`, a coroutine) on the pieces of :mod:`idempotency_pg.core`; a sync pool's
calls never suspend it, so :func:`run` drives it to the end (:func:`idempotency_pg.core.drive`) with no event loop.
"""

import asyncio
import inspect
import json
import logging
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import psycopg

from .core import PgTx, Rollback, aw, complete_args, drive, entered, fetchone, sqlstate
from .responses import Problem, answer_headers, claim_response, renderer, with_headers

log = logging.getLogger("idempotency_pg")

#: The lease's fields that the steps use, none that a session setting changes in its text form (the timestamps
#: ``expires_at`` and ``lease_until`` are left out: psycopg 3 cannot parse them under ``DateStyle = 'SQL'`` and
#: psycopg2 misreads them); psycopg 3 reads them in binary anyway (:meth:`_DB.lease`).
LEASE_SQL = ("SELECT l.outcome, l.http_status, l.lease_token, l.recovery_point, l.recovery_state, l.fencing_number, "
             "l.response_content_type, l.response_bytes, "
             "l.response_body::text AS body_text, l.response_headers::text AS headers_text "
             "FROM idem_lease(%(key)s::text, idem_fingerprint(%(method)s::text, %(path)s::text, NULL, "
             "%(content_type)s::text, %(body)s::bytea), make_interval(secs => %(lease)s), "
             "%(ttl)s::interval, %(scope)s::text) AS l")
EXTEND_SQL = "SELECT idem_lease_extend(%s::text, %s::uuid, make_interval(secs => %s), %s::text)"
CHECKPOINT_SQL = "SELECT idem_checkpoint(%s::text, %s::uuid, %s::text, %s::jsonb, %s::text)"
COMPLETE_SQL = ("SELECT idem_lease_complete_request(%s::text, %s::text, %s::uuid, %s::int, %s::text, %s::jsonb, "
                "%s::bytea)")
RELEASE_SQL = "SELECT idem_lease_release(%s::text, %s::uuid, %s::text)"

LEASE_LOST = "55000"  # object_not_in_prerequisite_state: another attempt holds the key now


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
    lease_seconds: float = 30.0
    _heartbeat: object = field(default=None, repr=False)

    def stop_heartbeat(self):
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def extend_args(self):
        return (self.key, self.token, self.lease_seconds, self.scope)


# --------------------------------------------------------------------------- the steps, written once

async def _run(db, *, key, scope, method, path, steps, finish, body_text=None, body=None, content_type=None,
               lease_seconds=30.0, ttl=None, replay_headers=None, render_problem=None, redact=(), store_body=True):
    # the fingerprint of idem_claim_request (CONTRACT.md "any-body"): the body's bytes and content type; a JSON
    # body_text (content type None) has 1.2's fingerprint, idem_hash of the jsonb
    if body is None:
        body = (body_text or "").encode("utf-8")
    row = await db.lease({"key": key, "method": method, "path": path, "body": bytes(body),
                          "content_type": content_type,
                          "lease": float(lease_seconds), "ttl": ttl, "scope": scope})
    if row["outcome"] != "claimed":  # a replay: 1.3's bytes and content type, else the jsonb body's text
        body = row["body_text"] if row.get("response_bytes") is None else bytes(row["response_bytes"])
        return claim_response(row["outcome"], row["http_status"], body, row["headers_text"],
                              content_type=row.get("response_content_type"), render_problem=render_problem)
    state = row["recovery_state"]
    if isinstance(state, str):
        state = json.loads(state)  # Django's psycopg2 connection leaves jsonb as text
    ctx = LeaseContext(key, scope, row["lease_token"], row["recovery_point"], dict(state or {}),
                       row.get("fencing_number"), lease_seconds=float(lease_seconds))
    names = [s.name for s in steps]
    start = names.index(ctx.recovery_point) + 1 if ctx.recovery_point in names else 0
    try:
        for step in steps[start:]:
            ctx.attempt_step = step.name
            state = ctx.state
            if step.action is not None:
                async with db.heartbeat(ctx):
                    state = await db.call(step.action, ctx)
            async with db.fenced_transaction(ctx) as tx:
                if step.commit is not None:
                    state = await db.call(step.commit, tx.handle, ctx, state)
                await tx.commit_with(CHECKPOINT_SQL, (key, ctx.token, step.name, json.dumps(state), scope))
            ctx.state, ctx.recovery_point = state, step.name
        async with db.fenced_transaction(ctx) as tx:
            response = await db.call(finish, tx.handle, ctx)
            if 500 <= response.status <= 599:
                raise Rollback(response)  # finish's writes roll back: the retry runs finish again
            args = complete_args({"key": key, "scope": scope, "redact": redact, "store_body": store_body}, response,
                                 replay_headers)  # the bytes sent, less what the route does not store
            await tx.commit_with(COMPLETE_SQL, args[:2] + (ctx.token,) + args[2:])
        # the key's expiry (CONTRACT.md "key-lifetime") on the answer, after it was stored without it
        return with_headers(response, answer_headers("claimed", row["headers_text"]))
    except Rollback as e:
        await db.release(ctx)  # the lease given back at once, the recovery point kept
        return e.response
    except BaseException as e:
        if isinstance(e, Exception) and sqlstate(e) == LEASE_LOST:
            log.info("idempotency: lease of %r lost at step %s", key, ctx.attempt_step)
            return _lost(render_problem)
        await db.release(ctx)
        raise


# A step's transaction in the round trips of a bare one (BEGIN / the step's writes / COMMIT): the fence travels with
# BEGIN and the checkpoint (or the completion) with COMMIT (core.PgTx).  The fence (idem_lease_extend) comes first:
# the token is still the key's (else 55000, before any local write), and the key's row stays locked by this
# transaction until it commits, so no takeover can slip in before the checkpoint or the completion.  Whatever fails
# in between, the transaction is rolled back before the connection goes back.

def _combinable(conn):
    """Only a psycopg connection in autocommit mode takes a hand-written BEGIN / COMMIT (one that is not would send
    a BEGIN of its own first; Django's connection keeps its transaction state itself: ``transaction.atomic``)."""
    return isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)) and conn.autocommit


class _InAtomic:
    """A step's transaction on a connection that opens and commits it itself (``conn.transaction()``)."""

    def __init__(self, conn):
        self.handle = conn

    async def commit_with(self, sql, params):
        return await fetchone(self.handle, sql, params)  # the block commits on exit


def _lost(render_problem=None):
    return renderer(render_problem)(Problem(409, "idempotency-key-in-progress", "Request in progress",
                                            "another attempt took this request over; retry later",
                                            [("Retry-After", "1")]))


class _Heartbeat:
    """Extends the lease every ``lease / 3`` seconds on a connection of its own while a step runs: a thread on a
    sync pool, an asyncio task on an async one."""

    def __init__(self, pool, ctx, asynchronous):
        self.pool, self.ctx = pool, ctx
        if asynchronous:
            self.task = asyncio.ensure_future(self._run_async())
        else:
            self.done = threading.Event()
            self.thread = threading.Thread(target=self._run_thread, daemon=True)
            self.thread.start()

    def stop(self):
        if hasattr(self, "task"):
            self.task.cancel()
            return
        self.done.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()

    async def wait(self):
        if hasattr(self, "task"):
            await asyncio.wait([self.task])  # no extend left running (never raises the task's cancellation)

    def _failed(self, e):
        """True to stop: the lease is lost (the step's checkpoint gets 55000 too and stops the run)."""
        if sqlstate(e) == LEASE_LOST:
            return True
        log.warning("idempotency: lease heartbeat failed", exc_info=True)  # never takes the request down
        return False

    def _run_thread(self):
        try:
            while not self.done.wait(self.ctx.lease_seconds / 3.0):
                try:
                    with self.pool.connection() as conn:
                        conn.execute(EXTEND_SQL, self.ctx.extend_args())
                except Exception as e:  # noqa: BLE001
                    if self._failed(e):
                        return
        finally:
            if hasattr(self.pool, "close_thread"):
                self.pool.close_thread()  # a pool with a connection per thread (Django's): this one's is done

    async def _run_async(self):
        while True:
            await asyncio.sleep(self.ctx.lease_seconds / 3.0)
            try:
                async with self.pool.connection() as conn:
                    await conn.execute(EXTEND_SQL, self.ctx.extend_args())
            except Exception as e:  # noqa: BLE001
                if self._failed(e):
                    return


class _DB:
    """The steps' database: a sync pool (every call returns at once, none suspends the coroutine) or an async one."""

    def __init__(self, pool, asynchronous):
        self.pool, self.asynchronous = pool, asynchronous

    async def lease(self, params):
        async with entered(self.pool.connection()) as conn:
            binary = {"binary": True} if isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)) else {}
            cur = await aw(conn.execute(LEASE_SQL, params, **binary))
            row = await aw(cur.fetchone())
            return dict(zip([d.name for d in cur.description], row))

    @asynccontextmanager
    async def heartbeat(self, ctx):
        ctx._heartbeat = hb = _Heartbeat(self.pool, ctx, self.asynchronous)
        try:
            yield
        finally:
            hb.stop()
            ctx._heartbeat = None
            await hb.wait()

    @asynccontextmanager
    async def fenced_transaction(self, ctx):
        async with entered(self.pool.connection()) as conn:
            if not _combinable(conn):  # Django's connection: one statement per round trip inside atomic()
                async with entered(conn.transaction()):
                    await aw(conn.execute(EXTEND_SQL, ctx.extend_args()))
                    yield _InAtomic(conn)
                return
            tx = PgTx(conn)
            try:
                await tx.begin_with(EXTEND_SQL, ctx.extend_args())
                yield tx
            except BaseException:
                await tx.rollback()  # the fence, a step's write, the checkpoint or finish failed (or finish's 5xx)
                raise

    async def call(self, fn, *args):
        result = fn(*args)
        if self.asynchronous or not inspect.isawaitable(result):
            return await aw(result)
        if inspect.iscoroutine(result):
            result.close()  # no "never awaited" warning on top of the error
        raise TypeError("%r returned an awaitable: async steps need run_async" % (fn,))

    async def release(self, ctx):
        try:
            async with entered(self.pool.connection()) as conn:
                await aw(conn.execute(RELEASE_SQL, (ctx.key, ctx.token, ctx.scope)))
        except Exception:  # noqa: BLE001 - stale (55000) or the database is gone: the lease runs out on its own
            pass


def run(pool, **kwargs):
    """Lease the key, run the steps that are not done yet, complete; returns the :class:`Response` to send.

    ``pool``: a ``psycopg_pool.ConnectionPool`` (or ``idempotency_pg.django.lease_pool()``).  The request is
    fingerprinted as ``idem_claim_request`` does it: ``body`` (bytes) and ``content_type`` (the request's, or None),
    or ``body_text`` (a JSON text, hashed as JSON)."""
    return drive(_run(_DB(pool, False), **kwargs))


async def run_async(pool, **kwargs):
    """:func:`run` on a ``psycopg_pool.AsyncConnectionPool`` (same keyword arguments); steps may be async."""
    return await _run(_DB(pool, True), **kwargs)


__all__ = ["LeaseContext", "Step", "run", "run_async", "sqlstate"]
