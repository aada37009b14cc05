"""The transactional flow shared by the adapters: its statements (psycopg 3, sync and async) for the WSGI and ASGI
middleware, and :class:`Options` (settings, claim parameters, refusals) for those two and the Django decorator.

Round trips (clients/CONTRACT.md "Round trips"): ``BEGIN`` travels with the claim and ``COMMIT`` with
``idem_complete``, each pair as one multi-statement message of the simple query protocol (a ``ClientCursor``:
psycopg binds the parameters on the client side, so no server-side prepared statement exists, which PgBouncer's
transaction pooling needs anyway).  With the handler's own statement that is 3 round trips, the same as a bare
``BEGIN`` / ``INSERT`` / ``COMMIT``.  Debian's psycopg 3.1 has no C speedups and its pipeline mode measured slower
than plain statements (bench/clients), so one message is used instead of a pipeline.

``combine=False`` sends the five statements one by one (the 1.0 clients' way), and ``combine="pipeline"`` sends
each pair in psycopg's pipeline mode: both only for the benchmark's comparison (bench/clients/python_roundtrips.py).
"""

import psycopg
from psycopg import errors as pgerrors
from psycopg.pq import TransactionStatus

from .header import KeyHeaderError
from .responses import (
    MAX_BODY_BYTES,
    PROBLEM_BASE,
    BodyTooLarge,
    HTTPProblem,
    body_too_large,
    parse_json_body,
    problem,
    sent_form,
    stored_form_of,
)

CLAIM_SELECT = (
    "SELECT c.outcome, c.http_status, c.response_body::text, c.response_headers::text "
    "FROM idem_claim(%(key)s::text, "
    "idem_hash(jsonb_build_object('method', %(method)s::text, 'path', %(path)s::text, 'body', %(body)s::jsonb)), "
    "%(ttl)s::interval, %(scope)s::text) AS c"
)
CLAIM_MESSAGE = "BEGIN; " + CLAIM_SELECT
# The body literal is written once; the statement returns jsonb's text of it, which is what a replay sends.
COMPLETE_SELECT = (
    "SELECT idem_complete(%(key)s::text, %(status)s::int, r.b, %(headers)s::jsonb, %(scope)s::text), r.b::text "
    "FROM (SELECT %(body)s::jsonb AS b) AS r"
)
COMPLETE_MESSAGE = COMPLETE_SELECT + "; COMMIT"

#: SQLSTATEs after which the whole transaction is run again.
RETRYABLE = (pgerrors.SerializationFailure, pgerrors.DeadlockDetected)
#: SQLSTATEs of the claim statement that mean the request body is not JSON that PostgreSQL accepts.
BAD_BODY = (pgerrors.InvalidTextRepresentation, pgerrors.UntranslatableCharacter, pgerrors.NumericValueOutOfRange)


class BadBody(Exception):
    """PostgreSQL refused the request body as jsonb (the claim rolled back; answer 400)."""


class Options:
    """What the WSGI middleware, the ASGI middleware and the Django decorator share: their settings, the request's
    claim parameters, and the answers they give before and around the claim.

    ``scope(request) -> str``: the key's scope, the authenticated tenant (may raise :class:`HTTPProblem`, e.g. a
    401); ``methods``: the ones claimed, others pass through; ``ttl``: how long a stored answer is kept (an
    interval, the extension's default if None); ``max_retries``: runs again after 40001/40P01;
    ``replay_headers``: the response headers stored and replayed (see :func:`stored_form_of`);
    ``problem_base``: the prefix of problem+json ``type``; ``max_body_bytes``: over it, 413.
    """

    def __init__(self, *, scope=None, methods=("POST", "PUT", "PATCH", "DELETE"), ttl=None, max_retries=3,
                 replay_headers=None, problem_base=PROBLEM_BASE, max_body_bytes=MAX_BODY_BYTES):
        self.scope = scope or (lambda request: "")
        self.methods = frozenset(m.upper() for m in methods)
        self.ttl = ttl
        self.max_retries = max_retries
        self.replay_headers = replay_headers
        self.problem_base = problem_base
        self.max_body_bytes = max_body_bytes

    def claim_params(self, key, method, path, raw, tenant):
        """The claim's parameters for a request; :class:`BadBody` if ``raw`` is not JSON."""
        try:
            body_text = parse_json_body(raw)
        except ValueError:
            raise BadBody() from None
        return claim_params(key, method, path or "/", body_text, self.ttl, tenant)

    def refused(self, exc):
        """The answer to one of :data:`REFUSED`, raised before the claim (or :class:`BadBody` by the claim)."""
        base = self.problem_base
        if isinstance(exc, HTTPProblem):
            return exc.response
        if isinstance(exc, KeyHeaderError):
            return problem(400, exc.slug, "Invalid Idempotency-Key" if exc.slug.endswith("invalid")
                           else "Idempotency-Key required", str(exc), (), base)
        if isinstance(exc, BodyTooLarge):
            return body_too_large(self.max_body_bytes, base)
        return problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON",
                       (), base)

    def conflict(self):
        """Every attempt ended in 40001/40P01."""
        return problem(409, "transaction-conflict", "Conflict",
                       "the request kept conflicting with concurrent requests; retry it", [("Retry-After", "1")],
                       self.problem_base)

    def failed(self, state=None):
        """The request failed (a database error with SQLSTATE ``state``, or an exception) and rolled back."""
        detail = ("database error (SQLSTATE %s); the request was rolled back" % state if state
                  else "the request failed and was rolled back")
        return problem(500, "internal-error", "Internal Server Error", detail, (), self.problem_base)


#: What the adapters answer at once, without a claim (or after the claim refused the body): :meth:`Options.refused`.
REFUSED = (HTTPProblem, KeyHeaderError, BodyTooLarge, BadBody)


def claim_params(key, method, path, body_text, ttl, scope):
    return {"key": key, "method": method, "path": path, "body": body_text, "ttl": ttl, "scope": scope}


def complete_params(params, status, stored):
    return {"key": params["key"], "status": status, "body": stored.body, "headers": stored.headers,
            "scope": params["scope"]}


def _in_transaction(conn):
    return conn.pgconn.transaction_status != TransactionStatus.IDLE


# --------------------------------------------------------------------------- sync (psycopg.Connection)

def claim(conn, params, combine=True):
    """Open the transaction and claim: returns the claim row.  Raises :class:`BadBody`."""
    try:
        if combine == "pipeline":
            with conn.pipeline():
                conn.execute("BEGIN")
                cur = conn.execute(CLAIM_SELECT, params)
        elif combine:
            cur = psycopg.ClientCursor(conn)
            cur.execute(CLAIM_MESSAGE, params)
            cur.nextset()  # the BEGIN's result comes first
        else:
            conn.execute("BEGIN")
            cur = conn.execute(CLAIM_SELECT, params)
        return cur.fetchone()
    except BAD_BODY as e:
        rollback(conn)
        raise BadBody() from e


def complete(conn, params, response, replay_headers=None, combine=True):
    """Store ``response`` and commit; returns the response to send (in its stored form)."""
    stored = stored_form_of(response, replay_headers)
    p = complete_params(params, response.status, stored)
    if combine == "pipeline":
        with conn.pipeline():
            cur = conn.execute(COMPLETE_SELECT, p)
            conn.execute("COMMIT")
    elif combine:
        cur = psycopg.ClientCursor(conn)
        cur.execute(COMPLETE_MESSAGE, p)  # raises if either statement failed (then COMMIT did not run)
    else:
        cur = conn.execute(COMPLETE_SELECT, p)
    stored.read_back = cur.fetchone()[1]
    if combine is False:
        conn.execute("COMMIT")
    return sent_form(response, stored)


def rollback(conn):
    """End the request's transaction without keeping anything, if one is open and the connection is usable."""
    if conn.closed or not _in_transaction(conn):
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass  # a broken connection: the pool discards it


# --------------------------------------------------------------------------- async (psycopg.AsyncConnection)

async def claim_async(conn, params, combine=True):
    try:
        if combine:
            cur = psycopg.AsyncClientCursor(conn)
            await cur.execute(CLAIM_MESSAGE, params)
            cur.nextset()
        else:
            await conn.execute("BEGIN")
            cur = await conn.execute(CLAIM_SELECT, params)
        return await cur.fetchone()
    except BAD_BODY as e:
        await rollback_async(conn)
        raise BadBody() from e


async def complete_async(conn, params, response, replay_headers=None, combine=True):
    stored = stored_form_of(response, replay_headers)
    p = complete_params(params, response.status, stored)
    if combine:
        cur = psycopg.AsyncClientCursor(conn)
        await cur.execute(COMPLETE_MESSAGE, p)
    else:
        cur = await conn.execute(COMPLETE_SELECT, p)
    stored.read_back = (await cur.fetchone())[1]
    if not combine:
        await conn.execute("COMMIT")
    return sent_form(response, stored)


async def rollback_async(conn):
    if conn.closed or not _in_transaction(conn):
        return
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        pass
