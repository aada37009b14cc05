"""ASGI middleware (Starlette, FastAPI, any ASGI app): claim the Idempotency-Key, run the app, store what it sent.

The app's answer is taken where ASGI hands it over, at ``send``: the ``http.response.start`` status and headers
and every ``http.response.body`` chunk, after the framework's own error handling (Starlette's
``ExceptionMiddleware`` turns ``HTTPException(422)`` into a 422 before it reaches ``send``).  That answer, and
only that one, is stored and committed, then sent; anything else (an exception, no answer, a 5xx) rolls back.

Two backends give the request's transaction to the app:

* :class:`PsycopgBackend`: a ``psycopg_pool.AsyncConnectionPool`` (psycopg 3's async connection); the app gets
  the ``AsyncConnection`` (``get_context(request).connection``).  BEGIN travels with the claim and COMMIT with
  the completion (:mod:`idempotency_pg.core`).
* :class:`SQLAlchemyBackend`: a SQLAlchemy ``sessionmaker`` (sync ``Session``, e.g. psycopg2); the app gets the
  ``Session`` (``get_context(request).session``) and its ORM writes are in the claim's transaction.  Its calls
  run in a worker thread; use ``def`` (not ``async def``) endpoints with it.
"""

import inspect
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from . import core
from .header import parse_idempotency_key
from .responses import (MAX_BODY_BYTES, BodyTooLarge, HTTPProblem, NotExecuted, Response, claim_response,
                        sent_form, stored_form_of)

log = logging.getLogger("idempotency_pg")

#: The key of the :class:`RequestContext` in the ASGI scope and in Starlette's ``request.state``.
CONTEXT = "idempotency_pg"


@dataclass
class RequestContext:
    """What the app behind the middleware gets (``get_context(request)``)."""

    handle: object  # the AsyncConnection (PsycopgBackend) or the Session (SQLAlchemyBackend)
    key: str
    scope: str
    attempt: int  # 0, then 1.. when the transaction runs again after 40001/40P01
    not_executed: bool = field(default=False)

    @property
    def connection(self):
        return self.handle

    @property
    def session(self):
        return self.handle


def get_context(request_or_scope):
    """The :class:`RequestContext` of a Starlette ``Request`` (or an ASGI scope) behind the middleware."""
    scope = getattr(request_or_scope, "scope", request_or_scope)
    try:
        return scope[CONTEXT]
    except KeyError:
        raise LookupError("no idempotency context: is the route behind IdempotencyASGIMiddleware?") from None


def mark_not_executed(request_or_scope):
    """Say that the answer being sent is "not executed" (validation before any write): it is sent, not stored,
    and the transaction rolls back (clients/CONTRACT.md "not-executed").  For exception handlers, which answer
    instead of raising; a handler can also ``raise NotExecuted(response)``."""
    get_context(request_or_scope).not_executed = True


def not_executed_on_validation_errors(app):
    """Make FastAPI's request validation answers (422, ``RequestValidationError``) not executed: the endpoint
    never ran, so nothing is stored and the corrected retry may reuse the key, as Stripe does."""
    from fastapi.exception_handlers import request_validation_exception_handler
    from fastapi.exceptions import RequestValidationError

    async def handler(request, exc):
        if CONTEXT in request.scope:
            mark_not_executed(request)
        return await request_validation_exception_handler(request, exc)

    app.add_exception_handler(RequestValidationError, handler)


# --------------------------------------------------------------------------- backends

class PsycopgBackend:
    """The request's transaction on a connection of a ``psycopg_pool.AsyncConnectionPool`` (open it with
    :func:`idempotency_pg.connect_kwargs`: ``prepare_threshold=None``, ``autocommit=True``)."""

    def __init__(self, pool, combine=True):
        self.pool = pool
        self.combine = combine

    @asynccontextmanager
    async def transaction(self):
        async with self.pool.connection() as conn:
            if conn.prepare_threshold is not None:
                conn.prepare_threshold = None  # no named prepared statements: PgBouncer transaction pooling
            yield _PsycopgTx(conn, self.combine)

    @staticmethod
    def retryable(exc):
        return isinstance(exc, core.RETRYABLE)

    @staticmethod
    def sqlstate(exc):
        return getattr(exc, "sqlstate", None)


class _PsycopgTx:
    def __init__(self, conn, combine):
        self.handle, self.combine = conn, combine

    async def claim(self, params):
        return await core.claim_async(self.handle, params, self.combine)

    async def complete(self, params, response, replay_headers):
        return await core.complete_async(self.handle, params, response, replay_headers, self.combine)

    async def rollback(self):
        await core.rollback_async(self.handle)


class SQLAlchemyBackend:
    """The request's transaction in a SQLAlchemy ``Session`` from ``session_factory`` (a ``sessionmaker``).

    The claim is the session's first statement, so the app's ORM writes (``session.add(...)``,
    ``session.flush()``) join its transaction; the middleware completes and commits.  The app must not commit
    (``session.begin_nested()`` is a savepoint and fine).  Round trips: the driver sends BEGIN and COMMIT on its
    own, so this variant costs two more than the psycopg one (bench/clients)."""

    def __init__(self, session_factory):
        self.session_factory = session_factory

    @asynccontextmanager
    async def transaction(self):
        from starlette.concurrency import run_in_threadpool

        session = self.session_factory()
        tx = _SQLAlchemyTx(session, run_in_threadpool)
        try:
            yield tx
        finally:
            if tx.open:
                await run_in_threadpool(session.close)
            else:
                session.close()  # nothing open: gives the connection back to the pool without a round trip

    @staticmethod
    def sqlstate(exc):
        orig = getattr(exc, "orig", exc)
        return getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)

    @classmethod
    def retryable(cls, exc):
        return cls.sqlstate(exc) in ("40001", "40P01")


class _SQLAlchemyTx:
    def __init__(self, session, run):
        self.handle, self.run = session, run
        self.open = False  # a transaction of ours is open in the session

    def _claim(self, params):
        self.open = True
        try:
            row = tuple(self.handle.connection().exec_driver_sql(core.CLAIM_SELECT, params).fetchone())
        except Exception as e:
            self._rollback()
            if SQLAlchemyBackend.sqlstate(e) in ("22P02", "22P05", "22003"):
                raise core.BadBody() from e
            raise
        if row[0] != "claimed":
            self._rollback()  # in the same trip to the worker thread: a 409 or a replay answers at once
        return row

    def _rollback(self):
        self.open = False
        self.handle.rollback()

    def _complete(self, params, response, replay_headers):
        stored = stored_form_of(response, replay_headers)
        row = self.handle.connection().exec_driver_sql(
            core.COMPLETE_SELECT, core.complete_params(params, response.status, stored)).fetchone()
        stored.read_back = row[1]
        self.open = False
        self.handle.commit()
        return sent_form(response, stored)

    async def claim(self, params):
        return await self.run(self._claim, params)

    async def complete(self, params, response, replay_headers):
        return await self.run(self._complete, params, response, replay_headers)

    async def rollback(self):
        if self.open:
            await self.run(self._rollback)


# --------------------------------------------------------------------------- the middleware

class IdempotencyASGIMiddleware(core.Options):
    """Wrap an ASGI app so that each request with an ``Idempotency-Key`` runs at most once.

    ``backend``: :class:`PsycopgBackend` or :class:`SQLAlchemyBackend`.  ``scope(asgi_scope) -> str`` (may be
    async) gives the key's scope, the authenticated tenant; it may raise :class:`HTTPProblem` (a 401).  Requests
    whose method is not in ``methods``, or for which ``when(asgi_scope)`` is false, pass through untouched.
    Per request: scope, key (400 if missing, invalid or several), body (413 over ``max_body_bytes``, 400 if not
    JSON), claim; ``claimed`` runs the app with :class:`RequestContext` in ``scope["idempotency_pg"]`` (and
    ``request.state.idempotency_pg``), buffers what it sends, stores it with ``idem_complete``, commits, and only
    then sends it, in its stored form (a replay is the same bytes).  A 5xx, an exception, no answer,
    :class:`NotExecuted` or :func:`mark_not_executed` roll back; 40001/40P01 runs it all again (``max_retries``).
    """

    def __init__(self, app, backend, *, when=None, **options):
        super().__init__(**options)  # scope, methods, ttl, max_retries, replay_headers, problem_base, max_body_bytes
        self.app = app
        self.backend = backend
        self.when = when

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"].upper() not in self.methods
                or (self.when is not None and not self.when(scope))):
            await self.app(scope, receive, send)
            return
        response = await self.handle(scope, receive)
        await send_response(send, response)

    async def handle(self, scope, receive):
        try:
            tenant = self.scope(scope)
            if inspect.isawaitable(tenant):
                tenant = await tenant
            key = parse_idempotency_key([v.decode("latin-1") for k, v in scope["headers"]
                                         if k.lower() == b"idempotency-key"] or None)
            raw = await read_body(scope, receive, self.max_body_bytes)
            params = self.claim_params(key, scope["method"].upper(), scope.get("root_path", "") + scope["path"],
                                       raw, tenant)
        except core.REFUSED as e:
            return self.refused(e)
        try:
            async with self.backend.transaction() as tx:
                for attempt in range(self.max_retries + 1):
                    try:
                        return await self._attempt(tx, scope, receive, raw, params, attempt)
                    except core.BadBody as e:
                        return self.refused(e)
                    except Exception as e:
                        if not self.backend.retryable(e):
                            raise
                        log.info("idempotency: %s on attempt %d, retrying", self.backend.sqlstate(e), attempt + 1)
                return self.conflict()
        except Exception as e:
            log.exception("idempotency: request failed")
            return self.failed(self.backend.sqlstate(e))

    async def _attempt(self, tx, scope, receive, raw, params, attempt):
        row = await tx.claim(params)
        try:
            early = claim_response(*row, base=self.problem_base)
            if early is not None:
                await tx.rollback()  # replay, mismatch, in_progress: nothing to keep
                return early
            ctx = RequestContext(tx.handle, params["key"], params["scope"], attempt)
            inner = dict(scope)
            inner[CONTEXT] = ctx
            inner["state"] = dict(scope.get("state") or {}, **{CONTEXT: ctx})
            try:
                result = await run_asgi(self.app, inner, raw, receive)
            except NotExecuted as ne:
                await tx.rollback()
                return ne.response
            except HTTPProblem as hp:
                result = hp.response
            if ctx.not_executed or 500 <= result.status <= 599:
                await tx.rollback()  # not stored, the app's writes undone, the key free again
                return result
            return await tx.complete(params, result, self.replay_headers)
        except BaseException:
            await tx.rollback()
            raise


async def read_body(scope, receive, limit=MAX_BODY_BYTES):
    """The whole request body, at most ``limit`` bytes (:class:`BodyTooLarge` beyond; a ``Content-Length`` over
    the limit is refused before reading anything)."""
    for k, v in scope["headers"]:
        if k.lower() == b"content-length":
            try:
                if int(v) > limit:
                    raise BodyTooLarge(int(v))
            except ValueError:
                pass
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def run_asgi(app, scope, body, receive):
    """Call an ASGI app with ``body`` as its request body, and buffer what it sends."""
    state = {"body_sent": False}
    start = {}
    chunks = []

    async def inner_receive():
        if not state["body_sent"]:
            state["body_sent"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then whatever the server says (a disconnect)

    async def inner_send(message):
        t = message["type"]
        if t == "http.response.start":
            if start:
                raise RuntimeError("http.response.start sent twice")
            start["status"] = message["status"]
            start["headers"] = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
        elif t == "http.response.body":
            if not start:
                raise RuntimeError("http.response.body before http.response.start")
            chunks.append(message.get("body", b""))

    await app(scope, inner_receive, inner_send)
    if not start:
        raise RuntimeError("the ASGI app returned without sending a response")
    return Response(start["status"], start["headers"], b"".join(chunks))


async def send_response(send, response):
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.wsgi_headers()]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def async_connection_pool(conninfo, min_size=4, max_size=20, **pool_kwargs):
    """A ``psycopg_pool.AsyncConnectionPool`` with :func:`idempotency_pg.connect_kwargs`, not opened yet
    (``await pool.open(wait=True)`` in the app's lifespan)."""
    from psycopg_pool import AsyncConnectionPool

    from . import connect_kwargs

    kwargs = dict(connect_kwargs())
    kwargs.update(pool_kwargs.pop("kwargs", {}))
    return AsyncConnectionPool(conninfo, min_size=min_size, max_size=max_size, kwargs=kwargs, open=False,
                               **pool_kwargs)


__all__ = ["CONTEXT", "IdempotencyASGIMiddleware", "PsycopgBackend", "RequestContext", "SQLAlchemyBackend",
           "async_connection_pool", "get_context", "mark_not_executed", "not_executed_on_validation_errors",
           "read_body", "run_asgi", "send_response"]
