"""WSGI middleware: the WSGI request and response translated to :meth:`idempotency_pg.core.Options.respond`."""

import io

from . import core
from .responses import MAX_BODY_BYTES, Response

#: environ keys the handler can read.
CONNECTION = "idempotency_pg.connection"  # the psycopg connection, inside the request's open transaction
KEY = "idempotency_pg.key"  # the parsed Idempotency-Key
SCOPE = "idempotency_pg.scope"  # the scope the key was claimed in
ATTEMPT = "idempotency_pg.attempt"  # 0 for the first run, 1.. for retries after 40001/40P01
CONTEXT = "idempotency_pg.context"  # the core.Context (``.not_executed = True`` answers without storing)


def get_connection(environ):
    """The connection of the request's transaction (for the handler behind the middleware)."""
    return environ[CONNECTION]


class IdempotencyMiddleware(core.Options):
    """Wrap a WSGI app so that each request with an ``Idempotency-Key`` runs at most once.

    ``pool`` is a ``psycopg_pool.ConnectionPool`` (:func:`idempotency_pg.connection_pool`); ``scope(environ)``
    and the other options: :class:`idempotency_pg.core.Options`.  The app runs with the connection in
    ``environ[CONNECTION]``, inside the claim's transaction, and the body, read whole and never parsed, again in
    ``wsgi.input`` (``CONTENT_LENGTH`` its length): it reads JSON, a form or multipart as it would without the
    middleware; its response is buffered, stored, committed, then sent.
    ``prepare`` (None: until a pooler shows it cannot) and ``combine`` (False: one statement per round trip): how
    the statements travel (:class:`idempotency_pg.core.PgTx`).  A replay is sent with the WSGI ``write`` callable
    before the ROLLBACK (waitress sends it at once with ``send_bytes=1``).
    """

    def __init__(self, app, pool, *, combine=True, prepare=None, **options):
        super().__init__(**options)
        self.app, self.pool, self.pipeline, self.preparing = app, pool, combine is not False, core.Preparing(prepare)

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD", "GET").upper() not in self.methods:
            return self.app(environ, start_response)

        def answer(r):
            start_response(r.status_line(), r.wsgi_headers())(r.body)
        response = self.handle(environ, answer)
        if response is None:
            return []
        start_response(response.status_line(), response.wsgi_headers())
        return [response.body]

    def handle(self, environ, answer=None):
        """Run the request and return the :class:`Response` to send (None if ``answer(response)`` sent it)."""

        async def run(ctx, raw):
            env = dict(environ, **{"wsgi.input": io.BytesIO(raw), "CONTENT_LENGTH": str(len(raw)), CONTEXT: ctx,
                                   CONNECTION: ctx.handle, KEY: ctx.key, SCOPE: ctx.scope, ATTEMPT: ctx.attempt})
            return run_wsgi(self.app, env)

        path, query = core.wsgi_target(environ)  # as the request line had them (CONTRACT.md "raw-target")
        return core.drive(self.respond(
            environ, environ.get("REQUEST_METHOD", "POST").upper(), path, environ.get("HTTP_IDEMPOTENCY_KEY"),
            lambda limit: read_body(environ, limit),
            lambda: core.pool_transaction(self.pool, self.preparing, self.pipeline), run, answer, query=query,
            content_type=environ.get("CONTENT_TYPE")))


def read_body(environ, limit=MAX_BODY_BYTES):
    """The whole request body, at most ``limit`` bytes: :class:`BodyTooLarge` for a ``Content-Length`` over the
    limit (nothing read) or a body without length that passes it, :class:`BodyIncomplete` for fewer bytes than the
    ``Content-Length``."""
    length = core.content_length(environ.get("CONTENT_LENGTH"))
    core.check_length(length, limit)
    stream = environ.get("wsgi.input")
    if length is not None:
        data = b""
        while len(data) < length:  # a stream may hand over less than asked: read until the length or its end
            chunk = stream.read(length - len(data)) if stream is not None else b""
            if not chunk:
                break
            data += chunk
        return core.check_whole(data, length, limit)
    if stream is None or not environ.get("wsgi.input_terminated"):
        return b""  # no length and a stream that may not end: PEP 3333 says read nothing
    return core.check_whole(stream.read(limit + 1), None, limit)


def run_wsgi(app, environ):
    """Call a WSGI app and buffer its whole response."""
    state, chunks = {}, []

    def start_response(status, headers, exc_info=None):
        if "status" in state and not exc_info:
            raise AssertionError("start_response called twice without exc_info")
        state["status"], state["headers"] = status, list(headers)
        return chunks.append

    result = app(environ, start_response)
    try:
        chunks.extend(chunk for chunk in result if chunk)
    finally:
        if hasattr(result, "close"):
            result.close()
    if "status" not in state:
        raise RuntimeError("the WSGI app returned without calling start_response")
    return Response(int(state["status"].split(" ", 1)[0]), state["headers"], b"".join(chunks))
