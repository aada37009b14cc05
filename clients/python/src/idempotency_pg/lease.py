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
(``idem_lease_extend``) is sent with ``BEGIN`` and the checkpoint (or the completion) with ``COMMIT``, as one
message each, on a psycopg connection in autocommit mode (:func:`idempotency_pg.connect_kwargs`).  Django's
connection keeps one statement per round trip: its ``transaction.atomic`` keeps the transaction's state itself
(its autocommit flag, the atomic blocks open), so a BEGIN or COMMIT sent behind its back would leave the ORM writes
of ``commit`` and ``finish`` in a transaction Django does not know it is in.

The steps are written once (:func:`_run`, a coroutine); a sync pool's calls never suspend it, so :func:`run`
drives it to the end with one ``send`` and no event loop.
"""

import asyncio
import inspect
import json
import logging
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import psycopg

from .core import rollback, rollback_async
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


def sqlstate(exc):
    """The SQLSTATE of a psycopg 3 error, a psycopg2 error, or a Django error wrapping one; else None."""
    for e in (exc, exc.__cause__):
        state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if state:
            return state
    return None


# --------------------------------------------------------------------------- the steps, written once

async def _run(db, *, key, scope, method, path, body_text, steps, finish, lease_seconds=30.0, ttl=None,
               replay_headers=None):
    row = await db.lease({"key": key, "method": method, "path": path, "body": body_text,
                          "lease": float(lease_seconds), "ttl": ttl, "scope": scope})
    if row["outcome"] != "claimed":
        return claim_response(row["outcome"], row["http_status"], row["body_text"], row["headers_text"])
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
                    state = await db.call(step.commit, tx.conn, ctx, state)
                await tx.commit_with(CHECKPOINT_SQL, (key, ctx.token, step.name, json.dumps(state), scope))
            ctx.state, ctx.recovery_point = state, step.name
        async with db.fenced_transaction(ctx) as tx:
            response = await db.call(finish, tx.conn, ctx)
            if 500 <= response.status <= 599:
                raise _NotStored(response)  # finish's writes roll back: the retry runs finish again
            stored = stored_form_of(response, replay_headers)
            out = await tx.commit_with(COMPLETE_SQL, {"key": key, "token": ctx.token, "status": response.status,
                                                      "body": stored.body, "headers": stored.headers,
                                                      "scope": scope})
        stored.read_back = out[1]
        return sent_form(response, stored)
    except _NotStored as e:
        await db.release(ctx)  # the lease given back at once, the recovery point kept
        return e.response
    except BaseException as e:
        if isinstance(e, Exception) and sqlstate(e) == LEASE_LOST:
            log.info("idempotency: lease of %r lost at step %s", key, ctx.attempt_step)
            return _lost()
        await db.release(ctx)
        raise


# A step's transaction in the round trips of a bare one (BEGIN / the step's writes / COMMIT): the fence travels
# with BEGIN and the checkpoint (or the completion) with COMMIT, each pair as one multi-statement message of the
# simple query protocol (a ClientCursor binds the parameters on the client, as core.CLAIM_MESSAGE does).
#
# The fence (idem_lease_extend) comes first: the token is still the key's (else 55000, before any local write), and
# the key's row stays locked by this transaction until it commits, so no takeover can slip in before the
# checkpoint or the completion.  If the fence fails, the message stops there (BEGIN ran, nothing else); if the
# checkpoint fails, COMMIT does not run: either way the transaction is rolled back before the connection goes back.
BEGIN_FENCE_MESSAGE = "BEGIN; " + EXTEND_SQL


def _combinable(conn):
    """Only a psycopg connection in autocommit mode takes a hand-written BEGIN / COMMIT (one that is not would send
    a BEGIN of its own first; Django's connection keeps its transaction state itself: ``transaction.atomic``)."""
    return isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)) and conn.autocommit


class _SyncTx:
    """A step's open transaction on a sync connection: ``conn`` for the step's writes, ``commit_with`` to end it."""

    def __init__(self, conn, combined):
        self.conn, self.combined = conn, combined

    async def commit_with(self, sql, params):
        """Run ``sql`` (one row back) and commit: one message if combined, else the statement and the caller's
        ``transaction()`` block commits on exit."""
        if not self.combined:
            return self.conn.execute(sql, params).fetchone()
        cur = psycopg.ClientCursor(self.conn)
        cur.execute(sql + "; COMMIT", params)  # raises if either failed (then COMMIT did not run)
        return cur.fetchone()


class _AsyncTx:
    def __init__(self, conn, combined):
        self.conn, self.combined = conn, combined

    async def commit_with(self, sql, params):
        if not self.combined:
            cur = await self.conn.execute(sql, params)
            return await cur.fetchone()
        cur = psycopg.AsyncClientCursor(self.conn)
        await cur.execute(sql + "; COMMIT", params)
        return await cur.fetchone()


class _NotStored(Exception):
    """``finish`` answered a 5xx: not stored, its transaction rolled back."""

    def __init__(self, response):
        super().__init__(response.status)
        self.response = response


def _lost():
    return problem(409, "idempotency-key-in-progress", "Request in progress",
                   "another attempt took this request over; retry later", [("Retry-After", "1")])


def _row_dict(cur, row):
    return dict(zip([d.name for d in cur.description], row))


# --------------------------------------------------------------------------- a sync pool (threads)

class _Heartbeat:
    """Extends the lease every ``lease / 3`` seconds on a connection of its own while a step runs."""

    def __init__(self, pool, ctx):
        self.pool, self.ctx = pool, ctx
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def stop(self):
        self.done.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()

    def _run(self):
        try:
            while not self.done.wait(self.ctx.lease_seconds / 3.0):
                try:
                    with self.pool.connection() as conn:
                        conn.execute(EXTEND_SQL, self.ctx.extend_args())
                except Exception as e:  # noqa: BLE001 - a heartbeat never takes the request down
                    if sqlstate(e) == LEASE_LOST:
                        return  # the step's checkpoint will get 55000 too and stop the run
                    log.warning("idempotency: lease heartbeat failed", exc_info=True)
        finally:
            close = getattr(self.pool, "close_thread", None)
            if close is not None:
                close()  # a pool with a connection per thread (Django's): this thread's is not needed any more


class _SyncDB:
    """The step coroutine's database on a sync pool: every call blocks and returns, none suspends."""

    def __init__(self, pool):
        self.pool = pool

    async def lease(self, params):
        with self.pool.connection() as conn:
            cur = conn.execute(LEASE_SQL, params)
            return _row_dict(cur, cur.fetchone())

    @asynccontextmanager
    async def heartbeat(self, ctx):
        ctx._heartbeat = hb = _Heartbeat(self.pool, ctx)
        hb.thread.start()
        try:
            yield
        finally:
            hb.stop()
            ctx._heartbeat = None

    @asynccontextmanager
    async def fenced_transaction(self, ctx):
        with self.pool.connection() as conn:
            if not _combinable(conn):  # Django's connection: one statement per round trip inside atomic()
                with conn.transaction():
                    conn.execute(EXTEND_SQL, ctx.extend_args())
                    yield _SyncTx(conn, combined=False)
                return
            try:
                psycopg.ClientCursor(conn).execute(BEGIN_FENCE_MESSAGE, ctx.extend_args())
                yield _SyncTx(conn, combined=True)
            except BaseException:
                rollback(conn)  # the fence, a step's write, the checkpoint or finish failed (or finish's 5xx)
                raise

    @staticmethod
    async def call(fn, *args):
        result = fn(*args)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # no "never awaited" warning on top of the error
            raise TypeError("%r returned an awaitable: async steps need run_async" % (fn,))
        return result

    async def release(self, ctx):
        try:
            with self.pool.connection() as conn:
                conn.execute(RELEASE_SQL, (ctx.key, ctx.token, ctx.scope))
        except Exception:  # noqa: BLE001 - stale (55000) or the database is gone: the lease runs out on its own
            pass


def run(pool, *, key, scope, method, path, body_text, steps, finish, lease_seconds=30.0, ttl=None,
        replay_headers=None):
    """Lease the key, run the steps that are not done yet, complete; returns the :class:`Response` to send.

    ``pool``: a ``psycopg_pool.ConnectionPool`` (or ``idempotency_pg.django.lease_pool()``)."""
    coro = _run(_SyncDB(pool), key=key, scope=scope, method=method, path=path, body_text=body_text, steps=steps,
                finish=finish, lease_seconds=lease_seconds, ttl=ttl, replay_headers=replay_headers)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a step awaited something: use run_async with an async pool")


# --------------------------------------------------------------------------- an async pool (asyncio)

class _AsyncHeartbeat:
    def __init__(self, pool, ctx):
        self.pool, self.ctx = pool, ctx
        self.task = asyncio.ensure_future(self._run())

    def stop(self):
        self.task.cancel()

    async def _run(self):
        while True:
            await asyncio.sleep(self.ctx.lease_seconds / 3.0)
            try:
                async with self.pool.connection() as conn:
                    await conn.execute(EXTEND_SQL, self.ctx.extend_args())
            except Exception as e:  # noqa: BLE001
                if sqlstate(e) == LEASE_LOST:
                    return
                log.warning("idempotency: lease heartbeat failed", exc_info=True)


class _AsyncDB:
    def __init__(self, pool):
        self.pool = pool

    async def lease(self, params):
        async with self.pool.connection() as conn:
            cur = await conn.execute(LEASE_SQL, params)
            return _row_dict(cur, await cur.fetchone())

    @asynccontextmanager
    async def heartbeat(self, ctx):
        ctx._heartbeat = hb = _AsyncHeartbeat(self.pool, ctx)
        try:
            yield
        finally:
            hb.stop()
            ctx._heartbeat = None
            await asyncio.wait([hb.task])  # no extend left running (waits, never raises the task's cancellation)

    @asynccontextmanager
    async def fenced_transaction(self, ctx):
        async with self.pool.connection() as conn:
            if not _combinable(conn):
                async with conn.transaction():
                    await conn.execute(EXTEND_SQL, ctx.extend_args())
                    yield _AsyncTx(conn, combined=False)
                return
            try:
                await psycopg.AsyncClientCursor(conn).execute(BEGIN_FENCE_MESSAGE, ctx.extend_args())
                yield _AsyncTx(conn, combined=True)
            except BaseException:
                await rollback_async(conn)
                raise

    @staticmethod
    async def call(fn, *args):
        result = fn(*args)
        return (await result) if inspect.isawaitable(result) else result

    async def release(self, ctx):
        try:
            async with self.pool.connection() as conn:
                await conn.execute(RELEASE_SQL, (ctx.key, ctx.token, ctx.scope))
        except Exception:  # noqa: BLE001 - as in _SyncDB.release
            pass


async def run_async(pool, **kwargs):
    """:func:`run` on a ``psycopg_pool.AsyncConnectionPool`` (same keyword arguments); steps may be async."""
    return await _run(_AsyncDB(pool), **kwargs)


__all__ = ["LeaseContext", "Step", "run", "run_async", "sqlstate"]
