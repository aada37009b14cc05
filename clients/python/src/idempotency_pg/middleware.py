"""WSGI middleware: claim the Idempotency-Key, run the handler, store its answer, all in one transaction."""

import io
import logging

import psycopg
from psycopg import errors as pgerrors

from .header import KeyHeaderError, parse_idempotency_key
from .responses import (
    PROBLEM_BASE,
    HTTPProblem,
    Response,
    claim_response,
    parse_json_body,
    problem,
    stored_form,
)

log = logging.getLogger("idempotency_pg")

#: environ keys the handler can read.
CONNECTION = "idempotency_pg.connection"  # the psycopg connection, inside the request's open transaction
KEY = "idempotency_pg.key"  # the parsed Idempotency-Key
SCOPE = "idempotency_pg.scope"  # the scope the key was claimed in
ATTEMPT = "idempotency_pg.attempt"  # 0 for the first run, 1.. for retries after 40001/40P01

CLAIM_SQL = (
    "SELECT c.outcome, c.http_status, c.response_body::text, c.response_headers::text "
    "FROM idem_claim(%(key)s, "
    "idem_hash(jsonb_build_object('method', %(method)s::text, 'path', %(path)s::text, 'body', %(body)s::jsonb)), "
    "%(ttl)s::interval, %(scope)s::text) AS c"
)
COMPLETE_SQL = "SELECT idem_complete(%s::text, %s::int, %s::jsonb, %s::jsonb, %s::text)"

#: SQLSTATEs after which the whole transaction is run again.
RETRYABLE = (pgerrors.SerializationFailure, pgerrors.DeadlockDetected)
#: SQLSTATEs of the claim statement that mean the request body is not JSON that PostgreSQL accepts.
BAD_BODY = (pgerrors.InvalidTextRepresentation, pgerrors.UntranslatableCharacter, pgerrors.NumericValueOutOfRange)


def get_connection(environ):
    """The connection of the request's transaction (for the handler behind the middleware)."""
    return environ[CONNECTION]


class _BadBody(Exception):
    pass


class IdempotencyMiddleware:
    """Wrap a WSGI app so that each request with an ``Idempotency-Key`` runs at most once.

    ``pool`` is a ``psycopg_pool.ConnectionPool`` (see :func:`idempotency_pg.connection_pool`).
    ``scope(environ) -> str`` gives the key's scope (the authenticated tenant); it may raise
    :class:`HTTPProblem` (e.g. a 401) to answer before anything else.  Requests whose method is not in
    ``methods`` are passed through untouched.

    Per request: scope, key (400 if missing or invalid), body (400 if not JSON), then in one transaction
    ``idem_claim``; on ``claimed`` the app runs with the connection in ``environ[CONNECTION]``, its response is
    buffered, stored with ``idem_complete``, committed, and only then sent.  A 5xx, an exception or a database error
    rolls everything back (nothing stored, the key free again).  40001/40P01 runs the whole transaction again, up to
    ``max_retries`` times.
    """

    def __init__(self, app, pool, *, scope=None, methods=("POST", "PUT", "PATCH", "DELETE"), ttl=None,
                 max_retries=3, replay_headers=None, problem_base=PROBLEM_BASE):
        self.app = app
        self.pool = pool
        self.scope = scope or (lambda environ: "")
        self.methods = frozenset(m.upper() for m in methods)
        self.ttl = ttl
        self.max_retries = max_retries
        self.replay_headers = replay_headers
        self.problem_base = problem_base

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD", "GET").upper() not in self.methods:
            return self.app(environ, start_response)
        response = self.handle(environ)
        start_response(response.status_line(), response.wsgi_headers())
        return [response.body]

    def handle(self, environ):
        """Run the request and return the :class:`Response` to send."""
        base = self.problem_base
        try:
            scope = self.scope(environ)
        except HTTPProblem as p:
            return p.response
        try:
            key = parse_idempotency_key(environ.get("HTTP_IDEMPOTENCY_KEY"))
        except KeyHeaderError as e:
            return problem(400, e.slug, "Invalid Idempotency-Key" if e.slug.endswith("invalid")
                           else "Idempotency-Key required", str(e), (), base)
        raw = read_body(environ)
        try:
            body_text = parse_json_body(raw)
        except ValueError:
            return self._bad_body()

        params = {
            "key": key,
            "method": environ.get("REQUEST_METHOD", "POST").upper(),
            "path": (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")) or "/",
            "body": body_text,
            "ttl": self.ttl,
            "scope": scope,
        }
        try:
            with self.pool.connection() as conn:
                if conn.prepare_threshold is not None:
                    conn.prepare_threshold = None  # no named prepared statements: PgBouncer transaction pooling
                for attempt in range(self.max_retries + 1):
                    try:
                        return self._attempt(conn, environ, raw, params, attempt)
                    except RETRYABLE as e:
                        log.info("idempotency: %s on attempt %d, retrying", e.sqlstate, attempt + 1)
                    except _BadBody:
                        return self._bad_body()
                return problem(409, "transaction-conflict", "Conflict",
                               "the request kept conflicting with concurrent requests; retry it",
                               [("Retry-After", "1")], base)
        except psycopg.Error as e:
            log.exception("idempotency: database error")
            return problem(500, "internal-error", "Internal Server Error",
                           "database error (SQLSTATE %s); the request was rolled back" % (e.sqlstate,), (), base)
        except Exception:
            log.exception("idempotency: handler error")
            return problem(500, "internal-error", "Internal Server Error",
                           "the request failed and was rolled back", (), base)

    def _bad_body(self):
        return problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON",
                       (), self.problem_base)

    def _attempt(self, conn, environ, raw, params, attempt):
        result = None
        with conn.transaction() as tx:
            try:
                row = conn.execute(CLAIM_SQL, params).fetchone()
            except BAD_BODY as e:
                raise _BadBody() from e
            result = claim_response(*row, base=self.problem_base)
            if result is not None:
                raise psycopg.Rollback(tx)  # replay, mismatch, in_progress: nothing to keep
            env = dict(environ)
            env["wsgi.input"] = io.BytesIO(raw)
            env["CONTENT_LENGTH"] = str(len(raw))
            env[CONNECTION] = conn
            env[KEY] = params["key"]
            env[SCOPE] = params["scope"]
            env[ATTEMPT] = attempt
            result = run_wsgi(self.app, env)
            if 500 <= result.status <= 599:
                raise psycopg.Rollback(tx)  # not cached, the handler's writes undone
            body_json, headers_json = stored_form(result, self.replay_headers)
            conn.execute(COMPLETE_SQL, (params["key"], result.status, body_json, headers_json, params["scope"]))
        return result  # committed (or rolled back for the early answers and 5xx)


def read_body(environ):
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    return stream.read(length) if length > 0 else b""


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
