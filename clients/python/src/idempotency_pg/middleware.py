"""WSGI middleware: claim the Idempotency-Key, run the handler, store its answer, all in one transaction."""

import io
import logging

import psycopg

from . import core
from .core import BAD_BODY, CLAIM_SELECT, COMPLETE_SELECT, RETRYABLE, BadBody  # noqa: F401 - 1.0 names
from .header import parse_idempotency_key
from .responses import MAX_BODY_BYTES, BodyTooLarge, HTTPProblem, NotExecuted, Response, claim_response

log = logging.getLogger("idempotency_pg")

#: environ keys the handler can read.
CONNECTION = "idempotency_pg.connection"  # the psycopg connection, inside the request's open transaction
KEY = "idempotency_pg.key"  # the parsed Idempotency-Key
SCOPE = "idempotency_pg.scope"  # the scope the key was claimed in
ATTEMPT = "idempotency_pg.attempt"  # 0 for the first run, 1.. for retries after 40001/40P01

#: The 1.0 names of the statements, kept for code that imported them.
CLAIM_SQL = CLAIM_SELECT
COMPLETE_SQL = COMPLETE_SELECT


def get_connection(environ):
    """The connection of the request's transaction (for the handler behind the middleware)."""
    return environ[CONNECTION]


class IdempotencyMiddleware(core.Options):
    """Wrap a WSGI app so that each request with an ``Idempotency-Key`` runs at most once.

    ``pool`` is a ``psycopg_pool.ConnectionPool`` (see :func:`idempotency_pg.connection_pool`).
    ``scope(environ) -> str`` gives the key's scope (the authenticated tenant); it may raise
    :class:`HTTPProblem` (e.g. a 401) to answer before anything else.  Requests whose method is not in
    ``methods`` are passed through untouched.

    Per request: scope, key (400 if missing, invalid or several), body (413 over ``max_body_bytes``, 400 if not
    JSON), then in one transaction ``idem_claim``; on ``claimed`` the app runs with the connection in
    ``environ[CONNECTION]``, its response is buffered, stored with ``idem_complete``, committed, and only then sent,
    in its stored form (a replay is the same bytes).  A 5xx, an exception or a database error rolls everything back
    (nothing stored, the key free again); so does :class:`NotExecuted` raised by the app, whose response is sent.
    :class:`HTTPProblem` raised by the app is its answer like any other (stored if below 500).  40001/40P01 runs the
    whole transaction again, up to ``max_retries`` times.  ``combine=False`` sends BEGIN, the claim, the
    completion and COMMIT as four round trips instead of two (for comparison only).
    """

    def __init__(self, app, pool, *, combine=True, **options):
        super().__init__(**options)  # scope, methods, ttl, max_retries, replay_headers, problem_base, max_body_bytes
        self.app = app
        self.pool = pool
        self.combine = combine

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD", "GET").upper() not in self.methods:
            return self.app(environ, start_response)
        response = self.handle(environ)
        start_response(response.status_line(), response.wsgi_headers())
        return [response.body]

    def handle(self, environ):
        """Run the request and return the :class:`Response` to send."""
        try:
            tenant = self.scope(environ)
            key = parse_idempotency_key(environ.get("HTTP_IDEMPOTENCY_KEY"))
            raw = read_body(environ, self.max_body_bytes)
            params = self.claim_params(key, environ.get("REQUEST_METHOD", "POST").upper(),
                                       environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""), raw, tenant)
        except core.REFUSED as e:
            return self.refused(e)
        try:
            with self.pool.connection() as conn:
                if conn.prepare_threshold is not None:
                    conn.prepare_threshold = None  # no named prepared statements: PgBouncer transaction pooling
                for attempt in range(self.max_retries + 1):
                    try:
                        return self._attempt(conn, environ, raw, params, attempt)
                    except RETRYABLE as e:
                        log.info("idempotency: %s on attempt %d, retrying", e.sqlstate, attempt + 1)
                    except BadBody as e:
                        return self.refused(e)
                return self.conflict()
        except psycopg.Error as e:
            log.exception("idempotency: database error")
            return self.failed(e.sqlstate)
        except Exception:
            log.exception("idempotency: handler error")
            return self.failed()

    def _attempt(self, conn, environ, raw, params, attempt):
        """One transaction: returns the response to send, committed or rolled back as it says."""
        row = core.claim(conn, params, self.combine)
        try:
            early = claim_response(*row, base=self.problem_base)
            if early is not None:
                core.rollback(conn)  # replay, mismatch, in_progress: nothing to keep
                return early
            env = dict(environ)
            env["wsgi.input"] = io.BytesIO(raw)
            env["CONTENT_LENGTH"] = str(len(raw))
            env[CONNECTION] = conn
            env[KEY] = params["key"]
            env[SCOPE] = params["scope"]
            env[ATTEMPT] = attempt
            try:
                result = run_wsgi(self.app, env)
            except NotExecuted as ne:
                core.rollback(conn)  # refused before doing anything: not stored, the key released
                return ne.response
            except HTTPProblem as hp:
                result = hp.response  # the app's own error answer: handled like any response it returns
            if 500 <= result.status <= 599:
                core.rollback(conn)  # not cached, the handler's writes undone
                return result
            return core.complete(conn, params, result, self.replay_headers, self.combine)
        except BaseException:
            core.rollback(conn)
            raise


def read_body(environ, limit=MAX_BODY_BYTES):
    """The request body, at most ``limit`` bytes; raises :class:`BodyTooLarge` beyond (a ``Content-Length`` over
    the limit is refused without reading the body)."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or -1)
    except ValueError:
        length = -1
    if length > limit:
        raise BodyTooLarge(length)
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    if length >= 0:
        return stream.read(length) if length > 0 else b""
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and a stream that may not end: PEP 3333 says read nothing
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise BodyTooLarge(len(data))
    return data


def run_wsgi(app, environ):
    """Call a WSGI app and buffer its whole response."""
    state = {}
    chunks = []

    def start_response(status, headers, exc_info=None):
        if "status" in state and not exc_info:
            raise AssertionError("start_response called twice without exc_info")
        state["status"] = status
        state["headers"] = list(headers)
        return chunks.append

    result = app(environ, start_response)
    try:
        for chunk in result:
            if chunk:
                chunks.append(chunk)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if "status" not in state:
        raise RuntimeError("the WSGI app returned without calling start_response")
    return Response(int(state["status"].split(" ", 1)[0]), state["headers"], b"".join(chunks))
