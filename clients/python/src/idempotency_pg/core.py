"""The one place where an attempt is decided: parse the key, read the body whole, claim, run the handler, capture its
answer, complete or release.  The framework adapters (:mod:`.middleware` WSGI, :mod:`.asgi`, :mod:`.django`) only
translate their request and response to :meth:`Options.respond`; lease mode (:mod:`.lease`) uses the same pieces.

The flow is written once, as a coroutine.  Async adapters await it; sync adapters run it with :func:`drive`: their
database calls return plain values, so it never suspends (:func:`aw` takes either).

Statements (clients/CONTRACT.md "Statements of 1.3"): ``idem_claim_request`` computes the fingerprint from the
request's parts and answers a replay with the bytes stored; ``idem_complete_request`` stores the bytes sent, so the
first answer is the handler's own bytes and every replay is the same.  :class:`PgTx` sends ``BEGIN`` with the claim
and ``COMMIT`` with the completion in psycopg's pipeline mode, one round trip each, as named prepared statements
(parsed and planned once per connection).  Through a pooler that does not carry named statements between
transactions (PgBouncer before 1.21 in transaction pooling) the first 26000 or 42P05 turns them off for good
(:class:`Preparing`) and the attempt runs again: the same statements, unnamed.  A replay, mismatch or in_progress is
answered before its ``ROLLBACK`` is sent where the adapter can (``answer``), so it costs the client one round trip.
"""

import inspect
import json
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg
from psycopg import errors as pgerrors
from psycopg.generators import execute
from psycopg.pq import TransactionStatus

from .header import KeyHeaderError, parse_idempotency_key
from .responses import (MAX_BODY_BYTES, PROBLEM_BASE, BodyIncomplete, BodyTooLarge, HTTPProblem, NotExecuted,
                        body_too_large, claim_response, parse_json_body, problem, replayed_headers)

log = logging.getLogger("idempotency_pg")

CLAIM_REQUEST = "SELECT idem_claim_request(%s, %s, %s, %s, %s, %s, %s, %s)"
COMPLETE_REQUEST = "SELECT idem_complete_request(%s, %s, %s, %s, %s, %s)"

#: SQLSTATEs after which the whole transaction runs again.
RETRYABLE_STATES = ("40001", "40P01")
#: SQLSTATEs of the claim that mean PostgreSQL refuses the request body as JSON (answered 400).
BAD_BODY_STATES = ("22P02", "22P05", "22003", "22021")
#: SQLSTATEs of a named prepared statement that the server connection does not have (26000) or has already (42P05):
#: a pooler in transaction mode moved the client to another server connection.
PREPARED_LOST_STATES = ("26000", "42P05")
#: psycopg's prepare_threshold that prepares only the statements sent with ``prepare=True``.
ONLY_ASKED = 2 ** 31 - 1


class BadBody(Exception):
    """PostgreSQL refused the request body as jsonb (the claim rolled back; answered 400)."""


#: What is answered before any claim (or after the claim refused the body): :meth:`Options.refused`.
REFUSED = (HTTPProblem, KeyHeaderError, BodyTooLarge, BodyIncomplete, BadBody, NotExecuted)


def sqlstate(exc):
    """The SQLSTATE of a psycopg 3 or psycopg2 error, or of a SQLAlchemy or Django error wrapping one; else None."""
    for e in (exc, getattr(exc, "orig", None), exc.__cause__):
        state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if state:
            return state
    return None


async def aw(value):
    """``await value`` if it is awaitable (an async driver's call), else ``value`` (a sync one's)."""
    return (await value) if inspect.isawaitable(value) else value


@asynccontextmanager
async def entered(cm):
    """Enter a context manager that is async (an async pool's ``connection()``) or not."""
    if hasattr(cm, "__aenter__"):
        async with cm as value:
            yield value
    else:
        with cm as value:
            yield value


def drive(coro):
    """Run a coroutine that never suspends (all its calls are sync) to its end and return its value."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a sync flow awaited something: use the async adapter")


# --------------------------------------------------------------------------- the request body

def content_length(value):
    """A Content-Length value as an int; None if absent or not a number (the server has refused those already)."""
    try:
        return int(value) if value not in (None, "", b"") else None
    except ValueError:
        return None


def check_length(length, limit):
    """Refuse a Content-Length over the limit before anything is read."""
    if length is not None and length > limit:
        raise BodyTooLarge(length)


def check_whole(data, length, limit):
    """``data`` as read: over the limit -> :class:`BodyTooLarge`; shorter than its Content-Length (the client hung
    up, the server handed over what came) -> :class:`BodyIncomplete`."""
    if len(data) > limit:
        raise BodyTooLarge(len(data))
    if length is not None and len(data) != length:
        raise BodyIncomplete("%d of %d bytes" % (len(data), length))
    return data


# --------------------------------------------------------------------------- the attempt

@dataclass
class Context:
    """What the handler gets (WSGI: ``environ``'s keys; ASGI: ``get_context(request)``; Django:
    ``request.idempotency``)."""

    handle: object  # the connection (psycopg, Django's) or the SQLAlchemy Session, in the claim's transaction
    key: str
    scope: str
    attempt: int  # 0, then 1.. when the transaction runs again after 40001/40P01
    not_executed: bool = False  # set by the handler: its answer is sent, not stored, the transaction rolled back

    @property
    def connection(self):
        return self.handle

    @property
    def session(self):
        return self.handle


class Options:
    """The flow's settings, shared by every adapter.

    ``scope(request) -> str`` (may be async): the key's scope, the authenticated tenant (may raise
    :class:`HTTPProblem`, e.g. a 401); ``methods``: the ones claimed, others pass through; ``ttl``: how long a stored
    answer is kept (an interval; the extension's default if None); ``max_retries``: runs again after 40001/40P01;
    ``replay_headers``: the response headers stored and replayed (:func:`.responses.replayed_headers`);
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

    async def intake(self, request, method, path, key_header, read_body, need_key=True):
        """The claim's parameters (with the body as ``params["raw"]``), or the answer that refuses the request:
        the scope, the key (unless not ``need_key``), the whole body (``read_body(limit)``), JSON.  Nothing is
        claimed yet."""
        try:
            tenant = await aw(self.scope(request))
            key = parse_idempotency_key(key_header) if need_key else ""
            raw = await aw(read_body(self.max_body_bytes))
            try:
                body_text = parse_json_body(raw)
            except ValueError:
                raise BadBody() from None
        except REFUSED as e:
            return self.refused(e)
        return {"key": key, "method": method, "path": path or "/", "body": body_text, "ttl": self.ttl,
                "scope": tenant, "raw": raw}

    async def respond(self, request, method, path, key_header, read_body, transaction, run, answer=None):
        """The answer to one request, or None if ``answer`` sent it already.  ``transaction()``: an (async) context
        manager giving a transaction object (``handle``, ``claim``, ``complete``, ``rollback``: :class:`PgTx`);
        ``run(ctx, raw)``: the handler, returns a :class:`Response` (or raises :class:`NotExecuted`,
        :class:`HTTPProblem`); ``answer(response)`` (optional): sends a replay, mismatch or in_progress answer at
        once, before the transaction's ROLLBACK."""
        params = await self.intake(request, method, path, key_header, read_body)
        if not isinstance(params, dict):
            return params
        try:
            async with entered(transaction()) as tx:
                for attempt in range(self.max_retries + 1):
                    try:
                        return await self._attempt(tx, params, attempt, run, answer)
                    except BadBody as e:
                        return self.refused(e)
                    except Exception as e:
                        if sqlstate(e) in PREPARED_LOST_STATES and getattr(tx, "may_unprepare", False):
                            tx.unprepare()  # a pooler in transaction mode: unnamed statements from now on
                            log.warning("idempotency: %s, prepared statements off", e)
                        elif sqlstate(e) not in RETRYABLE_STATES:
                            raise
                        log.info("idempotency: %s on attempt %d, retrying", sqlstate(e), attempt + 1)
                return self.conflict()
        except Exception as e:
            log.exception("idempotency: request failed")
            return self.failed(sqlstate(e))

    async def _attempt(self, tx, params, attempt, run, answer):
        """One transaction: the response to send, committed or rolled back as it says."""
        try:
            outcome, status, content_type, headers, body = await tx.claim(params)
            early = claim_response(outcome, status, body, headers, self.problem_base, content_type)
            if early is not None:
                if answer is not None:
                    await aw(answer(early))
                    early = None  # sent
                await tx.rollback()  # replay, mismatch, in_progress: nothing to keep
                return early
            ctx = Context(tx.handle, params["key"], params["scope"], attempt)
            try:
                result = await run(ctx, params["raw"])
            except NotExecuted as ne:
                ctx.not_executed, result = True, ne.response
            except HTTPProblem as hp:
                result = hp.response  # the handler's own error answer: like any response it returns
            if ctx.not_executed or 500 <= result.status <= 599:
                await tx.rollback()  # not stored, the handler's writes undone, the key free again
                return result
            return await tx.complete(params, result, self.replay_headers)
        except BaseException:
            await tx.rollback()
            raise

    def refused(self, exc):
        """The answer to one of :data:`REFUSED`."""
        base = self.problem_base
        if isinstance(exc, (HTTPProblem, NotExecuted)):
            return exc.response
        if isinstance(exc, KeyHeaderError):
            return problem(400, exc.slug, "Invalid Idempotency-Key" if exc.slug.endswith("invalid")
                           else "Idempotency-Key required", str(exc), (), base)
        if isinstance(exc, BodyTooLarge):
            return body_too_large(self.max_body_bytes, base)
        if isinstance(exc, BodyIncomplete):
            return problem(400, "request-body-incomplete", "Incomplete request body",
                           "the request body ended before its Content-Length (%s)" % exc, (), base)
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


def claim_args(params):
    """``idem_claim_request``'s arguments: the fingerprint's JSON form (no query, no content type: the body is hashed
    as JSON, 1.2's fingerprint) of the raw body."""
    return (params["key"], params["scope"], params["method"], params["path"], None, None, params["raw"],
            params["ttl"])


def complete_args(params, response, replay_headers):
    """``idem_complete_request``'s arguments: the bytes sent, the content type apart from the other headers."""
    headers = replayed_headers(response, replay_headers)
    content_type = next((headers.pop(k) for k in list(headers) if k.lower() == "content-type"), None)
    return (params["key"], params["scope"], response.status, content_type, json.dumps(headers), response.body)


def claim_fields(value):
    r"""The fields ``(outcome, http_status, content_type, headers as JSON text, body bytes)`` of an
    ``idem_request_claim`` in its text form, the record literal ``(f1,f2,f3,f4,f5)``: an empty field is NULL, a
    quoted one has ``""`` and ``\\`` for ``"`` and ``\``; the body is bytea's hex form ``\x...``."""
    fields, i, end = [], 1, len(value) - 1
    while i <= end:
        if value[i] == '"':
            out, i = [], i + 1
            while value[i] != '"' or value[i + 1:i + 2] == '"':
                out.append(value[i + 1] if value[i] in '"\\' else value[i])
                i += 2 if value[i] in '"\\' else 1
            fields.append("".join(out))
            i += 2  # the closing quote and the comma
        else:
            j = value.find(",", i)
            j = end if j < 0 else j
            fields.append(value[i:j] or None)
            i = j + 1
    outcome, status, content_type, headers, body = fields
    return (outcome, int(status) if status else None, content_type, headers,
            bytes.fromhex(body[2:]) if body is not None else None)


class Preparing:
    """Whether :class:`PgTx` sends named prepared statements: ``None`` (the default) until a 26000 or 42P05 says
    the connections are pooled in transaction mode, then off; ``True`` or ``False`` to decide it yourself."""

    def __init__(self, prepare=None):
        self.on, self.auto = prepare is not False, prepare is None


# --------------------------------------------------------------------------- psycopg 3, sync and async

class PgTx:
    """A transaction on a psycopg 3 connection (``Connection`` or ``AsyncConnection``) in autocommit mode, in the
    round trips of a bare one: :meth:`begin_with` sends ``BEGIN`` with the first statement, :meth:`commit_with` the
    last one with ``COMMIT``, each pair in pipeline mode (``pipeline=False``: one statement per round trip, for
    the benchmark's comparison).  If a statement fails, the rest does not run; :meth:`rollback` then ends it."""

    def __init__(self, conn, preparing=None, pipeline=True):
        self.handle, self.preparing, self.pipeline = conn, preparing or Preparing(False), pipeline
        conn.prepare_threshold = ONLY_ASKED if self.preparing.on else None  # never the handler's statements

    @property
    def may_unprepare(self):
        return self.preparing.on and self.preparing.auto

    def unprepare(self):
        self.preparing.on = False
        self.handle.prepare_threshold = None

    async def _one_row(self, sql, params, before=None, after=None):
        conn, prepare = self.handle, self.preparing.on
        if not self.pipeline:
            if before:
                await aw(conn.execute(before))
            row = await aw((await aw(conn.execute(sql, params, prepare=prepare))).fetchone())
            if after:
                await aw(conn.execute(after))
            return row
        async with entered(conn.pipeline()):
            if before:
                await aw(conn.execute(before))
            cur = await aw(conn.execute(sql, params, prepare=prepare))
            if after:
                await aw(conn.execute(after))
        return await aw(cur.fetchone())

    async def begin_with(self, sql, params):
        return await self._one_row(sql, params, before="BEGIN")

    async def commit_with(self, sql, params):
        return await self._one_row(sql, params, after="COMMIT")

    async def claim(self, params):
        """``BEGIN`` and the claim: its fields (:func:`claim_fields`); :class:`BadBody` if the body is not JSON."""
        try:
            return claim_fields((await self.begin_with(CLAIM_REQUEST, claim_args(params)))[0])
        except pgerrors.Error as e:
            if e.sqlstate in BAD_BODY_STATES:
                raise BadBody() from e
            raise

    async def complete(self, params, response, replay_headers):
        """Store ``response`` as sent and commit; the response to send."""
        await self.commit_with(COMPLETE_REQUEST, complete_args(params, response, replay_headers))
        return response

    async def rollback(self):
        """End the transaction without keeping anything, if one is open and the connection is usable."""
        conn = self.handle
        if conn.closed or conn.pgconn.transaction_status == TransactionStatus.IDLE:
            return
        try:
            if self.preparing.on:
                # psycopg 3.1 drops its prepared statements after every ROLLBACK it runs (and sends DEALLOCATE ALL):
                # this one goes through libpq, so they stay (PREPARE is not transactional: nothing to forget).
                conn.pgconn.send_query(b"ROLLBACK")
                await aw(conn.wait(execute(conn.pgconn)))
            else:
                await aw(conn.execute("ROLLBACK"))
        except psycopg.Error:
            pass  # a broken connection: the pool discards it


@asynccontextmanager
async def pool_transaction(pool, preparing=None, pipeline=True):
    """A :class:`PgTx` on a connection of a psycopg pool (sync or async)."""
    async with entered(pool.connection()) as conn:
        yield PgTx(conn, preparing, pipeline)
