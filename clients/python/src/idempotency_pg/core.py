"""The one place where an attempt is decided: parse the key, read the body whole, claim, run the handler, capture its
answer, complete or release.  The framework adapters (:mod:`.middleware` WSGI, :mod:`.asgi`, :mod:`.django`) only
translate their request and response to :meth:`Options.respond`; lease mode (:mod:`.lease`) uses the same pieces.

The flow is written once, as a coroutine.  Async adapters await it; sync adapters run it with :func:`drive`: their
database calls return plain values, so it never suspends (:func:`aw` takes either).

Statements (clients/CONTRACT.md "Statements of 1.3"): ``idem_claim_request`` computes the fingerprint from the
request's parts and answers a replay with the bytes stored; ``idem_complete_request`` stores the bytes sent, so the
first answer is the handler's own bytes and every replay is the same.  :class:`PgTx` sends ``BEGIN`` with the claim
and ``COMMIT`` with the completion in libpq's pipeline mode, one round trip each, as named prepared statements
(parsed and planned once per connection).  Their names are unique to the client connection (:class:`Named`), so a
name never means another text on a server connection, and the first claim of a connection prepares both, so
through a pooler that does not carry named statements between transactions (PgBouncer before 1.21 in transaction
pooling) the first transaction that lands on another server connection fails at the claim's Bind with 26000,
before anything has run.  That turns them off for good (:class:`Preparing`) and the attempt runs again from the
claim: the same statements, unnamed.  A 26000 or 42P05 after the handler ran turns them off too, but the request
is answered 500 (rolled back), never run again.  A replay, mismatch or in_progress is
answered before its ``ROLLBACK`` is sent where the adapter can (``answer``), so it costs the client one round trip.
"""

import hashlib
import inspect
import json
import logging
import secrets
import weakref
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from urllib.parse import quote

import psycopg
from psycopg import errors as pgerrors
from psycopg.adapt import PyFormat, Transformer
from psycopg.generators import execute, fetch_many, send
from psycopg.pq import ExecStatus, TransactionStatus

from .header import KeyHeaderError, parse_idempotency_key
from .responses import (MAX_BODY_BYTES, PROBLEM_BASE, BodyIncomplete, BodyTooLarge, HTTPProblem, NotExecuted,
                        Problem, answer_headers, claim_response, renderer, replayed_headers, stored_body,
                        with_headers)

log = logging.getLogger("idempotency_pg")

CLAIM_REQUEST = "SELECT idem_claim_request(%s, %s, %s, %s, %s, %s, %s, %s)"
COMPLETE_REQUEST = "SELECT idem_complete_request(%s, %s, %s, %s, %s, %s)"
#: The same statements as libpq prepares them (no casts: no overloads, the server infers each parameter's type).
CLAIM_NATIVE = b"SELECT idem_claim_request($1, $2, $3, $4, $5, $6, $7, $8)"
COMPLETE_NATIVE = b"SELECT idem_complete_request($1, $2, $3, $4, $5, $6)"

#: SQLSTATEs after which the whole transaction runs again.
RETRYABLE_STATES = ("40001", "40P01")
#: SQLSTATEs of the claim that mean PostgreSQL refuses the request body as JSON (answered 400).
BAD_BODY_STATES = ("22P02", "22P05", "22003", "22021")
#: SQLSTATEs of a named prepared statement that the server connection does not have (26000) or has already (42P05):
#: a pooler in transaction mode moved the client to another server connection.
PREPARED_LOST_STATES = ("26000", "42P05")


class BadBody(Exception):
    """PostgreSQL refused the request body as jsonb (a JSON media type, or none, with a body that is not JSON: the
    claim rolled back, nothing claimed; answered 400 ``request-body-not-json``)."""


class PreparedLost(Exception):
    """The claim's named statement is not on this server connection (26000) or its name is taken (42P05): a pooler
    in transaction mode.  Nothing has run; the attempt runs again unnamed."""


class Rollback(Exception):
    """Leaves a transaction block so that it rolls back, with the ``response`` to send (a 5xx: not stored)."""

    def __init__(self, response):
        super().__init__(response.status)
        self.response = response


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


async def fetchone(conn, sql, params=None):
    """The first row of ``sql`` on a sync or async connection (psycopg's, or one with its ``execute``)."""
    return await aw((await aw(conn.execute(sql, params))).fetchone())


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


def driven(fn):
    """A coroutine function that never suspends (:func:`drive`), as a plain function."""
    return lambda *args: drive(fn(*args))


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
    ``render_problem(problem) -> Response`` (CONTRACT.md "error-shape"): writes every answer the middleware makes
    itself (a :class:`.responses.Problem`: 400 key, 409, 410, 413, 422 mismatch, 500) in the API's own shape;
    default problem+json.  ``redact`` (JSON Pointers) and ``store_body`` (CONTRACT.md "store-less"): what the
    route's stored answer leaves out (:func:`.responses.stored_body`); the first answer is sent whole.
    """

    def __init__(self, *, scope=None, methods=("POST", "PUT", "PATCH", "DELETE"), ttl=None, max_retries=3,
                 replay_headers=None, problem_base=PROBLEM_BASE, max_body_bytes=MAX_BODY_BYTES,
                 render_problem=None, redact=(), store_body=True, store_options=None):
        self.scope = scope or (lambda request: "")
        self.methods = frozenset(m.upper() for m in methods)
        self.ttl = ttl
        self.max_retries = max_retries
        self.replay_headers = replay_headers
        self.problem_base = problem_base
        self.max_body_bytes = max_body_bytes
        self.render_problem = renderer(render_problem, problem_base)
        self.redact, self.store_body = _pointers(redact), bool(store_body)
        self.store_options = store_options

    async def intake(self, request, method, path, key_header, read_body, need_key=True, query=None,
                     content_type=None):
        """The claim's parameters (with the body as ``params["raw"]``), or the answer that refuses the request:
        the scope, the key (unless not ``need_key``), the whole body (``read_body(limit)``), never parsed
        (CONTRACT.md "any-body": its bytes and ``content_type``, the request's ``Content-Type`` or None, go to the
        claim).  ``query``: the raw query string (:func:`raw_query`).  Nothing is claimed yet."""
        try:
            tenant = await aw(self.scope(request))
            key = parse_idempotency_key(key_header) if need_key else ""
            raw = await aw(read_body(self.max_body_bytes))
            store = {"redact": self.redact, "store_body": self.store_body}
            if self.store_options is not None:
                override = await aw(self.store_options(request, path or "/")) or {}
                store.update((k, _pointers(v) if k == "redact" else bool(v)) for k, v in override.items()
                             if k in store)
        except REFUSED as e:
            return self.refused(e)
        return dict({"key": key, "method": method, "path": path or "/", "query": raw_query(query),
                     "content_type": _native_text(content_type) if content_type else None, "ttl": self.ttl,
                     "scope": tenant, "raw": raw}, **store)

    async def respond(self, request, method, path, key_header, read_body, transaction, run, answer=None,
                      query=None, content_type=None):
        """The answer to one request, or None if ``answer`` sent it already (``query``, ``content_type``: as
        :meth:`intake`).  ``transaction()``: an (async) context
        manager giving a transaction object (``handle``, ``claim``, ``complete``, ``rollback``: :class:`PgTx`);
        ``run(ctx, raw)``: the handler, returns a :class:`Response` (or raises :class:`NotExecuted`,
        :class:`HTTPProblem`); ``answer(response)`` (optional): sends a replay, mismatch or in_progress answer at
        once, before the transaction's ROLLBACK."""
        params = await self.intake(request, method, path, key_header, read_body, query=query,
                                   content_type=content_type)
        if not isinstance(params, dict):
            return params
        try:
            async with entered(transaction()) as tx:
                attempt = 0
                while attempt <= self.max_retries:
                    try:
                        return await self._attempt(tx, params, attempt, run, answer)
                    except BadBody as e:
                        return self.refused(e)
                    except PreparedLost as e:
                        # at the claim, before the handler: unnamed statements from now on, the same attempt again
                        tx.unprepare()
                        log.warning("idempotency: %s, prepared statements off", e.__cause__)
                        continue
                    except Exception as e:
                        if sqlstate(e) not in RETRYABLE_STATES:
                            raise
                        log.info("idempotency: %s on attempt %d, retrying", sqlstate(e), attempt + 1)
                    attempt += 1
                return self.conflict()
        except Exception as e:
            log.exception("idempotency: request failed")
            return self.failed(sqlstate(e))

    async def _attempt(self, tx, params, attempt, run, answer):
        """One transaction: the response to send, committed or rolled back as it says."""
        try:
            outcome, status, content_type, headers, body = await tx.claim(params)
            early = claim_response(outcome, status, body, headers, self.problem_base, content_type,
                                   self.render_problem)
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
            sent = await tx.complete(params, result, self.replay_headers)
            # the key's expiry (CONTRACT.md "key-lifetime") on the first answer, after it was stored without it
            return with_headers(sent, answer_headers(outcome, headers))
        except BaseException:
            await tx.rollback()
            raise

    def refused(self, exc):
        """The answer to one of :data:`REFUSED`."""
        render = self.render_problem
        if isinstance(exc, (HTTPProblem, NotExecuted)):
            return exc.response  # the application's own answer, in its own shape already
        if isinstance(exc, KeyHeaderError):
            return render(Problem(400, exc.slug, "Invalid Idempotency-Key" if exc.slug.endswith("invalid")
                                  else "Idempotency-Key required", str(exc)))
        if isinstance(exc, BodyTooLarge):
            return render(Problem(413, "request-too-large", "Request body too large",
                                  "the request body is over %d bytes" % self.max_body_bytes))
        if isinstance(exc, BodyIncomplete):
            return render(Problem(400, "request-body-incomplete", "Incomplete request body",
                                  "the request body ended before its Content-Length (%s)" % exc))
        return render(Problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON"))

    def conflict(self):
        """Every attempt ended in 40001/40P01."""
        return self.render_problem(Problem(409, "transaction-conflict", "Conflict",
                                           "the request kept conflicting with concurrent requests; retry it",
                                           [("Retry-After", "1")]))

    def failed(self, state=None):
        """The request failed (a database error with SQLSTATE ``state``, or an exception) and rolled back."""
        detail = ("database error (SQLSTATE %s); the request was rolled back" % state if state
                  else "the request failed and was rolled back")
        return self.render_problem(Problem(500, "internal-error", "Internal Server Error", detail))


def _pointers(redact):
    """``redact`` as a tuple of JSON Pointers; ValueError for one that is not (RFC 6901: each starts with /)."""
    redact = (redact,) if isinstance(redact, str) else tuple(redact or ())
    for pointer in redact:
        if not isinstance(pointer, str) or not pointer.startswith("/"):
            raise ValueError("redact: %r is not a JSON Pointer (RFC 6901: it starts with /)" % (pointer,))
    return redact


#: What a request target carries unencoded in its path (RFC 3986: unreserved, sub-delims, ":", "@", "/"): a path
#: rebuilt from a decoded one (:func:`asgi_target`, :func:`wsgi_target` without the raw target) percent-encodes every
#: other byte.
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def _native_text(value):
    """Bytes, or a WSGI native string (the bytes as latin-1), as text: UTF-8 decoded (invalid bytes replaced)."""
    if isinstance(value, str):
        value = value.encode("latin-1", "replace")
    return bytes(value).decode("utf-8", "replace")


def split_target(target):
    """``(path, query)`` of a request target as sent (CONTRACT.md "raw-target"): the path up to the first ``?``,
    undecoded, as text (``/`` if empty), and the query after it, as it came (:func:`raw_query` takes it: an empty
    one is none, so a trailing ``?`` is no query).  ``target``: bytes or a WSGI native string."""
    sep = "?" if isinstance(target, str) else b"?"
    path, _, query = target.partition(sep)
    return _native_text(path) or "/", query


def asgi_target(scope):
    """``(path, query)`` of an ASGI request as its request line had them (the query as it came, for
    :func:`raw_query`): ``raw_path``, the undecoded path the server received (a ``root_path`` the server was given
    is not part of it), and ``query_string``.  A server that gives no ``raw_path`` (it is optional in ASGI):
    ``root_path`` + ``path`` percent-encoded again (:data:`PATH_SAFE`), which cannot tell ``%2F`` from ``/`` nor
    ``%41`` from ``A``."""
    raw = scope.get("raw_path")
    if raw is not None:
        path, _ = split_target(bytes(raw))  # a server that left the query in raw_path: the path before it
        return path, scope.get("query_string")
    path = quote((scope.get("root_path", "") + scope.get("path", "")).encode("utf-8", "surrogateescape"),
                 safe=PATH_SAFE)
    return path or "/", scope.get("query_string")


def wsgi_target(environ):
    """``(path, query)`` of a WSGI request as its request line had them (the query as it came, for
    :func:`raw_query`): ``RAW_URI`` (gunicorn, Werkzeug) or ``REQUEST_URI`` (waitress, gunicorn, uWSGI, mod_wsgi,
    Werkzeug), the target as received, split at its first ``?`` (:func:`split_target`).  A server that sets
    neither (wsgiref): ``SCRIPT_NAME`` + ``PATH_INFO`` (decoded by the server) percent-encoded again
    (:data:`PATH_SAFE`), which cannot tell ``%2F`` from ``/`` nor ``%41`` from ``A``, and ``QUERY_STRING``."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return split_target(raw)
    path = quote((environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1", "replace"),
                 safe=PATH_SAFE)
    return path or "/", environ.get("QUERY_STRING")


def raw_query(value):
    """The request's raw query string as the fingerprint takes it (CONTRACT.md "Statements of 1.3"): without the
    ``?``, as sent (no decoding, no reordering), None when there is none.  ``value``: bytes (ASGI's
    ``query_string``) or a WSGI native string (the bytes as latin-1); UTF-8 bytes come out as their text, as the
    Go and Node.js clients pass them."""
    if not value:
        return None
    if isinstance(value, str):
        value = value.encode("latin-1", "replace")
    return bytes(value).decode("utf-8", "replace").removeprefix("?") or None


def claim_args(params):
    """``idem_claim_request``'s arguments: the raw query, the request's content type (a JSON media type, or none
    with a body, is hashed as JSON: 1.2's fingerprint when there is no query; any other as bytes) and the raw
    body."""
    return (params["key"], params["scope"], params["method"], params["path"], params.get("query"),
            params.get("content_type"), params["raw"], params["ttl"])


def complete_args(params, response, replay_headers):
    """``idem_complete_request``'s arguments: the bytes sent, the content type apart from the other headers, less
    what the route does not store (``params["redact"]``, ``params["store_body"]``: :func:`.responses.stored_body`,
    dropped here, before the completing statement, so the row never holds it)."""
    headers = replayed_headers(response, replay_headers)
    content_type = next((headers.pop(k) for k in list(headers) if k.lower() == "content-type"), None)
    body, headers = stored_body(response.body, headers, params.get("redact") or (), params.get("store_body", True))
    if body is None:
        content_type = None  # store body: no -> only the status and the headers
    return (params["key"], params["scope"], response.status, content_type, json.dumps(headers), body)


def claim_fields(value, encoding="utf-8"):
    """The fields ``(outcome, http_status, content_type, headers as JSON text, body bytes)`` of an
    ``idem_request_claim`` as a driver hands it over: bytes are its binary form (:func:`claim_fields_binary`, what
    psycopg 3 reads), a string its text form (:func:`claim_fields_text`, psycopg2's)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return claim_fields_binary(bytes(value), encoding)
    return claim_fields_text(value)


def claim_fields_binary(data, encoding="utf-8"):
    """The fields of an ``idem_request_claim`` in PostgreSQL's binary composite layout (CONTRACT.md "Statements of
    1.3"): an int32 field count, then per field a uint32 type OID, an int32 length (-1: NULL) and the value (text:
    its bytes in the client encoding; integer: int32 big-endian; jsonb: version byte 1 then the JSON text; bytea:
    the bytes).  No session setting (bytea_output, DateStyle, ...) changes any of it."""
    count = int.from_bytes(data[0:4], "big", signed=True)
    if count < 5:
        raise ValueError("idem_request_claim: %d fields in its binary form, 5 expected" % count)
    fields, pos = [], 4
    for _ in range(5):
        length = int.from_bytes(data[pos + 4:pos + 8], "big", signed=True)
        pos += 8
        if length < 0:
            fields.append(None)
        else:
            fields.append(data[pos:pos + length])
            pos += length
    outcome, status, content_type, headers, body = fields
    if headers is not None:
        if headers[:1] != b"\x01":
            raise ValueError("idem_request_claim: jsonb binary version %r, 1 expected" % headers[:1])
        headers = headers[1:].decode(encoding)
    return (outcome.decode(encoding), int.from_bytes(status, "big", signed=True) if status is not None else None,
            content_type.decode(encoding) if content_type is not None else None, headers, body)


def claim_fields_text(value):
    r"""The fields of an ``idem_request_claim`` in its text form, the record literal ``(f1,f2,f3,f4,f5)``: an empty
    field is NULL, a quoted one has ``""`` and ``\\`` for ``"`` and ``\``; trailing fields past the five (a later
    version's) are not read; the body is bytea's text form, in
    either of the two that ``bytea_output`` chooses (:func:`bytea_from_text`)."""
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
    outcome, status, content_type, headers, body = fields[:5]  # fields a later version adds after them: not read
    return (outcome, int(status) if status else None, content_type, headers,
            bytea_from_text(body) if body is not None else None)


def bytea_from_text(text):
    r"""bytea's text form as bytes: ``\x`` and hex digits (``bytea_output = hex``), or the escape form
    (``bytea_output = escape``: printable ASCII as itself, ``\\`` for a backslash, ``\ooo`` in octal for any
    other byte).  A value in escape form never starts with ``\x`` (its backslash would be doubled)."""
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    out, i = bytearray(), 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(ord(c))
            i += 1
        elif text[i + 1] == "\\":
            out.append(0x5C)
            i += 2
        else:
            out.append(int(text[i + 1:i + 4], 8))
            i += 4
    return bytes(out)


class Preparing:
    """Whether :class:`PgTx` sends named prepared statements: ``None`` (the default) until a 26000 or 42P05 says
    the connections are pooled in transaction mode, then off; ``True`` or ``False`` to decide it yourself."""

    def __init__(self, prepare=None):
        self.on, self.auto = prepare is not False, prepare is None


class Named:
    """The named statements of one client connection: names unique to it (a random part) and to the text (a hash
    of it), so behind a pooler two client connections never prepare one name on a server connection, and a name
    never means another text there; ``prepared``: whether this connection's server has them (set from the Parse
    results: a Parse that succeeded stays, PREPARE is not transactional)."""

    def __init__(self):
        token = secrets.token_hex(8)
        self.claim, self.complete = (b"idem_%s_%s" % (hashlib.sha256(text).hexdigest()[:8].encode(), token.encode())
                                     for text in (CLAIM_NATIVE, COMPLETE_NATIVE))
        self.prepared = False


#: Each psycopg connection's :class:`Named` (gone with the connection: a new connection prepares again).
_named = weakref.WeakKeyDictionary()


def named_of(conn):
    named = _named.get(conn)
    if named is None:
        named = _named[conn] = Named()
    return named


def _native_params(conn, args):
    """``args`` as libpq parameters: bytes in binary (bytea's binary form is the bytes), NULL as None, anything else
    in text as psycopg writes it (the server infers each type from the function)."""
    tx = Transformer(conn)
    values, formats = [], []
    for arg in args:
        if arg is None:
            values.append(None)
            formats.append(0)
        elif isinstance(arg, (bytes, bytearray, memoryview)):
            values.append(bytes(arg))
            formats.append(1)
        else:
            values.append(bytes(tx.get_dumper(arg, PyFormat.TEXT).dump(arg)))
            formats.append(0)
    return values, formats


def _pipeline(pgconn, sends):
    """A libpq pipeline (a generator for ``conn.wait``): call each of ``sends`` (each queues one command), a Sync,
    one round trip; the results of each command (PIPELINE_ABORTED after an error).  On any exception before the
    Sync's result the connection is closed: half a pipeline cannot be resumed (the pool discards it)."""
    pgconn.enter_pipeline_mode()
    try:
        for queue in sends:
            queue()
        pgconn.pipeline_sync()
        yield from send(pgconn)
        results = []
        for _ in sends:
            results.append((yield from fetch_many(pgconn)))
        yield from fetch_many(pgconn)  # the Sync's PIPELINE_SYNC
        pgconn.exit_pipeline_mode()
    except BaseException:
        pgconn.finish()
        raise
    return results


def _raise_first_error(conn, results):
    for res in results:
        for r in res:
            if r.status == ExecStatus.FATAL_ERROR:
                raise pgerrors.error_from_result(r, encoding=conn.info.encoding)
        if any(r.status == ExecStatus.PIPELINE_ABORTED for r in res):
            raise psycopg.OperationalError("pipeline aborted without an error")


# --------------------------------------------------------------------------- psycopg 3, sync and async

class PgTx:
    """A transaction on a psycopg 3 connection (``Connection`` or ``AsyncConnection``) in autocommit mode, in the
    round trips of a bare one: :meth:`begin_with` sends ``BEGIN`` with the first statement, :meth:`commit_with` the
    last one with ``COMMIT``, each pair in pipeline mode (``pipeline=False``: one statement per round trip, for
    the benchmark's comparison).  The claim and the completion go as named statements (:class:`Named`) through
    libpq while ``preparing`` says so (psycopg's own names, ``_pg3_0``, ``_pg3_1``, ..., are the same on every
    client connection).  If a statement fails, the rest does not run; :meth:`rollback` then ends it."""

    def __init__(self, conn, preparing=None, pipeline=True):
        self.handle, self.preparing, self.pipeline = conn, preparing or Preparing(False), pipeline
        conn.prepare_threshold = None  # psycopg never names the handler's statements (_pg3_N collide behind a pooler)

    def unprepare(self):
        self.preparing.on = False  # for every connection of the pool: the pooler is the same

    async def _one_row(self, sql, params, before=None, after=None):
        """``before``, ``sql``, ``after`` (one round trip, or one each); the row of ``sql``, read in binary: no
        session setting (bytea_output, DateStyle, TimeZone, IntervalStyle, extra_float_digits) changes a value."""
        conn = self.handle
        async with entered(conn.pipeline() if self.pipeline else nullcontext()):  # one round trip, or one each
            if before:
                await aw(conn.execute(before))
            cur = await aw(conn.execute(sql, params, prepare=False, binary=True))
            if after:
                await aw(conn.execute(after))
        return await aw(cur.fetchone())

    async def _named_row(self, which, args, before=None, after=None):
        """``before``, the named statement ``which`` of :class:`Named` (both parsed first if this connection has
        not), ``after``: one round trip through libpq (``pipeline=False``: one each, until one fails); the
        statement's value in binary, as bytes (no session setting changes it)."""
        conn = self.handle
        pgconn, named = conn.pgconn, named_of(conn)
        values, formats = _native_params(conn, args)
        sends = []
        if before:
            sends.append(lambda: pgconn.send_query_params(before, None))
        parses = 0
        if not named.prepared:
            sends.append(lambda: pgconn.send_prepare(named.claim, CLAIM_NATIVE))
            sends.append(lambda: pgconn.send_prepare(named.complete, COMPLETE_NATIVE))
            parses = 2
        sends.append(lambda: pgconn.send_query_prepared(getattr(named, which), values, formats, result_format=1))
        if after:
            sends.append(lambda: pgconn.send_query_params(after, None))
        results = []
        for group in ([sends] if self.pipeline else [[one] for one in sends]):  # one round trip, or one each
            results += await aw(conn.wait(_pipeline(pgconn, group)))
            if any(r.status != ExecStatus.COMMAND_OK and r.status != ExecStatus.TUPLES_OK for res in results
                   for r in res):
                break
        first = 1 if before else 0
        done = results[first:first + parses]
        if parses and len(done) == parses and all(r.status == ExecStatus.COMMAND_OK for res in done for r in res):
            named.prepared = True
        _raise_first_error(conn, results)
        row = results[first + parses][0]
        value = row.get_value(0, 0)
        return None if value is None else bytes(value)

    async def begin_with(self, sql, params):
        return await self._one_row(sql, params, before="BEGIN")

    async def commit_with(self, sql, params):
        return await self._one_row(sql, params, after="COMMIT")

    async def claim(self, params):
        """``BEGIN`` and the claim: its fields (:func:`claim_fields`, read in binary); :class:`BadBody` if the body
        is not JSON, :class:`PreparedLost` if the named statement is lost to a pooler (nothing has run)."""
        named = self.preparing.on  # as sent: another request may turn preparing off meanwhile
        try:
            if named:
                value = await self._named_row("claim", claim_args(params), before=b"BEGIN")
            else:
                value = (await self.begin_with(CLAIM_REQUEST, claim_args(params)))[0]
            return claim_fields(value, self.handle.info.encoding)
        except pgerrors.Error as e:
            if e.sqlstate in BAD_BODY_STATES:
                raise BadBody() from e
            if e.sqlstate in PREPARED_LOST_STATES and named and self.preparing.auto:
                raise PreparedLost(str(e)) from e
            raise

    async def complete(self, params, response, replay_headers):
        """Store ``response`` as sent and commit; the response to send.  A 26000 or 42P05 here (after the handler
        ran) turns the named statements off for the next requests and fails this one (rolled back: 500)."""
        args = complete_args(params, response, replay_headers)
        named = self.preparing.on
        try:
            if named:
                await self._named_row("complete", args, after=b"COMMIT")
            else:
                await self.commit_with(COMPLETE_REQUEST, args)
        except pgerrors.Error as e:
            if e.sqlstate in PREPARED_LOST_STATES and named and self.preparing.auto:
                self.unprepare()
                log.warning("idempotency: %s at the completion, prepared statements off", e)
            raise
        return response

    async def rollback(self):
        """End the transaction without keeping anything, if one is open and the connection is usable."""
        conn = self.handle
        if conn.closed or conn.pgconn.transaction_status == TransactionStatus.IDLE:
            return
        try:
            # through libpq: psycopg 3.1 would send DEALLOCATE ALL after a ROLLBACK it runs if it had named anything
            conn.pgconn.send_query(b"ROLLBACK")
            await aw(conn.wait(execute(conn.pgconn)))
        except psycopg.Error:
            pass  # a broken connection: the pool discards it


@asynccontextmanager
async def pool_transaction(pool, preparing=None, pipeline=True):
    """A :class:`PgTx` on a connection of a psycopg pool (sync or async)."""
    async with entered(pool.connection()) as conn:
        yield PgTx(conn, preparing, pipeline)
