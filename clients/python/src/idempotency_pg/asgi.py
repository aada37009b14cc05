"""ASGI middleware (Starlette, FastAPI, any ASGI app): the ASGI request and response translated to
:meth:`idempotency_pg.core.Options.respond`.

The app's answer is taken where ASGI hands it over, at ``send`` (after the framework's own error handling:
Starlette's ``ExceptionMiddleware`` turns ``HTTPException(422)`` into a 422 before it reaches ``send``); that answer,
and only that one, is stored and committed, then sent.  The app's request transaction comes from a backend:

* :class:`PsycopgBackend`: a ``psycopg_pool.AsyncConnectionPool``; the app gets the ``AsyncConnection``
  (``get_context(request).connection``), BEGIN travels with the claim and COMMIT with the completion.
* :class:`SQLAlchemyBackend`: a ``sessionmaker`` (sync ``Session``, e.g. psycopg2); the app gets the ``Session``
  (``get_context(request).session``), its ORM writes join the claim's transaction; its calls run in a worker
  thread, so use ``def`` (not ``async def``) endpoints with it.
"""

from contextlib import asynccontextmanager

from . import core
from .core import Context as RequestContext
from .responses import MAX_BODY_BYTES, Response

#: The key of the :class:`RequestContext` in the ASGI scope and in Starlette's ``request.state``.
CONTEXT = "idempotency_pg"


def get_context(request_or_scope):
    """The :class:`RequestContext` of a Starlette ``Request`` (or an ASGI scope) behind the middleware."""
    try:
        return getattr(request_or_scope, "scope", request_or_scope)[CONTEXT]
    except KeyError:
        raise LookupError("no idempotency context: is the route behind IdempotencyASGIMiddleware?") from None


def mark_not_executed(request_or_scope):
    """The answer being sent is "not executed" (validation before any write): sent, not stored, rolled back
    (clients/CONTRACT.md "not-executed").  For exception handlers; a handler can ``raise NotExecuted(response)``."""
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


class PsycopgBackend:
    """The request's transaction on a connection of a ``psycopg_pool.AsyncConnectionPool`` (open it with
    :func:`idempotency_pg.connect_kwargs`: ``autocommit=True``); ``prepare`` and ``combine``: as
    :class:`idempotency_pg.IdempotencyMiddleware`'s."""

    def __init__(self, pool, combine=True, prepare=None):
        self.pool, self.pipeline, self.preparing = pool, combine is not False, core.Preparing(prepare)

    def transaction(self):
        return core.pool_transaction(self.pool, self.preparing, self.pipeline)


class SQLAlchemyBackend:
    """The request's transaction in a SQLAlchemy ``Session`` from ``session_factory`` (a ``sessionmaker``): the
    claim is its first statement, the app's ORM writes join it, the middleware completes and commits (the app must
    not commit; ``session.begin_nested()`` is fine).  The driver sends BEGIN and COMMIT on its own: two round
    trips more than :class:`PsycopgBackend`."""

    def __init__(self, session_factory):
        self.session_factory = session_factory

    @asynccontextmanager
    async def transaction(self):
        from starlette.concurrency import run_in_threadpool

        tx = _SQLAlchemyTx(self.session_factory(), run_in_threadpool)
        try:
            yield tx
        finally:
            await tx.run(tx.handle.close) if tx.open else tx.handle.close()  # nothing open: no round trip


class _SQLAlchemyTx:
    def __init__(self, session, run):
        self.handle, self.run, self.open = session, run, False

    def _claim(self, params):
        self.open = True
        try:
            row = core.claim_fields(self.handle.connection().exec_driver_sql(
                core.CLAIM_REQUEST, core.claim_args(params)).fetchone()[0])
        except Exception as e:
            self._rollback()
            raise core.BadBody() if core.sqlstate(e) in core.BAD_BODY_STATES else e
        if row[0] != "claimed":
            self._rollback()  # in the same trip to the worker thread: a 409 or a replay answers at once
        return row

    def _rollback(self):
        self.open = False
        self.handle.rollback()

    def _complete(self, params, response, replay_headers):
        self.handle.connection().exec_driver_sql(core.COMPLETE_REQUEST,
                                                 core.complete_args(params, response, replay_headers))
        self.open = False
        self.handle.commit()
        return response

    async def claim(self, params):
        return await self.run(self._claim, params)

    async def complete(self, params, response, replay_headers):
        return await self.run(self._complete, params, response, replay_headers)

    async def rollback(self):
        if self.open:
            await self.run(self._rollback)


class IdempotencyASGIMiddleware(core.Options):
    """Wrap an ASGI app so that each request with an ``Idempotency-Key`` runs at most once.

    ``backend``: :class:`PsycopgBackend` or :class:`SQLAlchemyBackend`; ``scope(asgi_scope)`` (may be async) and
    the other options: :class:`idempotency_pg.core.Options`.  Requests whose method is not in ``methods``, or for
    which ``when(asgi_scope)`` is false, pass through.  The app runs with the :class:`RequestContext` in
    ``scope["idempotency_pg"]`` (and ``request.state.idempotency_pg``); :func:`mark_not_executed` or
    ``raise NotExecuted(response)`` answers without storing.
    """

    def __init__(self, app, backend, *, when=None, **options):
        super().__init__(**options)
        self.app, self.backend, self.when = app, backend, when

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"].upper() not in self.methods
                or (self.when is not None and not self.when(scope))):
            return await self.app(scope, receive, send)
        response = await self.handle(scope, receive, lambda r: send_response(send, r))
        if response is not None:
            await send_response(send, response)

    async def handle(self, scope, receive, answer=None):
        """The :class:`Response` to send (None if ``answer(response)`` sent it: a replay, before the ROLLBACK)."""
        async def run(ctx, raw):
            inner = dict(scope, **{CONTEXT: ctx, "state": dict(scope.get("state") or {}, **{CONTEXT: ctx})})
            return await run_asgi(self.app, inner, raw, receive)

        keys = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"idempotency-key"]
        path, query = core.asgi_target(scope)  # as the request line had them (CONTRACT.md "raw-target")
        return await self.respond(scope, scope["method"].upper(), path, keys or None,
                                  lambda limit: read_body(scope, receive, limit), self.backend.transaction, run,
                                  answer, query=query, content_type=content_type(scope))


def content_type(scope):
    """The request's ``Content-Type`` value as sent (bytes), or None."""
    return next((v for k, v in scope["headers"] if k.lower() == b"content-type"), None)


async def read_body(scope, receive, limit=MAX_BODY_BYTES):
    """The whole request body, at most ``limit`` bytes: :class:`BodyTooLarge` for a ``Content-Length`` over the
    limit (nothing read) or a body that passes it, :class:`BodyIncomplete` if the client disconnects first."""
    length = core.content_length(next((v for k, v in scope["headers"] if k.lower() == b"content-length"), None))
    core.check_length(length, limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise core.BodyIncomplete("the client disconnected after %d bytes" % size)
        chunk = message.get("body", b"")
        size += len(chunk)
        core.check_length(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return core.check_whole(b"".join(chunks), length, limit)


async def run_asgi(app, scope, body, receive):
    """Call an ASGI app with ``body`` as its request body (its first ``receive``: the framework's JSON, form and
    multipart parsers read it as they would without the middleware), and buffer what it sends."""
    given, start, chunks = [], {}, []

    async def inner_receive():
        if not given:
            given.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then whatever the server says (a disconnect)

    async def inner_send(message):
        if message["type"] == "http.response.start":
            if start:
                raise RuntimeError("http.response.start sent twice")
            start.update(status=message["status"], headers=[(k.decode("latin-1"), v.decode("latin-1"))
                                                            for k, v in message.get("headers", [])])
        elif message["type"] == "http.response.body":
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

    kwargs = dict(connect_kwargs(), **pool_kwargs.pop("kwargs", {}))
    return AsyncConnectionPool(conninfo, min_size=min_size, max_size=max_size, kwargs=kwargs, open=False,
                               **pool_kwargs)


__all__ = ["CONTEXT", "IdempotencyASGIMiddleware", "PsycopgBackend", "RequestContext", "SQLAlchemyBackend",
           "async_connection_pool", "get_context", "mark_not_executed", "not_executed_on_validation_errors",
           "read_body", "run_asgi", "send_response"]
