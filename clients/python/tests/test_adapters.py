"""Every framework adapter against the same checks of clients/CONTRACT.md, with one handler that writes a ledger row
and then answers, raises or fails as the request's ``X-Then`` says: WSGI (:class:`IdempotencyMiddleware`, the
statements pipelined and prepared, one per round trip, or unprepared), ASGI (FastAPI/Starlette) on psycopg's async
connection and on a SQLAlchemy session, and Django (``@idempotent``).  Each request reaches the adapter as its server
would hand it over: a WSGI environ (Django's ``WSGIRequest`` of one), or an ASGI scope with ``receive`` and ``send``.

The status committed is the one the framework answered after its own error handling: a handler that writes, then
raises or returns an error, never commits a status it did not answer."""

import asyncio
import io
import json
import sys
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes
from wsgiref.util import setup_testing_defaults

import pytest

from idempotency_pg import MAX_BODY_BYTES, HTTPProblem, IdempotencyMiddleware, NotExecuted, Response, problem, run_wsgi
from idempotency_pg.core import aw, drive
from idempotency_pg.middleware import CONTEXT

from conftest import needs_db
from test_integration import ledger, stored_outcome

pytestmark = needs_db

INSERT = "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES (%s, -1, 'EUR', %s)"
PAY = b'{"amount_cents": 1, "currency": "EUR"}'
#: The answers the handler returns after its write (its own spacing and key order: replayed as these bytes).
ANSWERS = {
    "created": Response(201, [("Content-Type", "application/json"), ("Location", "/x/1")],
                        b'{"z": 1,   "a": [1, 2.50, "x"], "m": {"b": null, "aa": true}}'),
    "text": Response(200, [("Content-Type", "text/plain; charset=utf-8")], b"  spaced\n text  "),
    # every byte, and what a text form of bytea could be mistaken for (backslashes, an octal escape, \x)
    "binary": Response(201, [("Content-Type", "application/octet-stream"), ("Location", "/x/2")],
                       bytes(range(256)) + b'\\x00 "\\\\" \\377'),
    "latin-1": Response(200, [("Content-Type", "text/plain; charset=latin-1")],
                        'café \\ "q" ß\n'.encode("latin-1")),
    "return-500": Response(500, [("Content-Type", "text/plain")], b"failed"),
}
#: What every adapter answers to each X-Then (status, a part of the body); each adapter adds its own.
EXPECT = {"return-500": (500, b"failed"), "crash": (500, b'"status":500'), "db-error": (500, b"SQLSTATE 22012"),
          "not-executed": (409, b"/conflict"), "mark": (422, b"/invalid")}


@dataclass
class Req:
    account: str
    then: str = "created"
    keys: tuple = ("k",)  # the Idempotency-Key header lines
    body: bytes = PAY
    length: object = "whole"  # the Content-Length: of the whole body, a number (over len(body): cut short), None
    query: str = ""
    path: str = "/t"
    target: str = None  # the request target as sent (percent-encoded); None: path and query

    def content_length(self):
        return len(self.body) if self.length == "whole" else self.length

    def raw(self):
        """The target as sent, and its path and query as a server hands them over: the path percent-decoded (WSGI's
        PATH_INFO: the bytes as latin-1; ASGI's path: UTF-8), the query as sent."""
        target = self.target if self.target is not None else self.path + ("?" + self.query if self.query else "")
        path, _, query = target.partition("?")
        return target, unquote_to_bytes(path), query


def environ(rq):
    """A WSGI environ, as a server hands it over: no Content-Length is a chunked body (``wsgi.input_terminated``),
    several header lines are joined with a comma."""
    target, path, query = rq.raw()
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": path.decode("latin-1"), "QUERY_STRING": query,
           "REQUEST_URI": target, "CONTENT_TYPE": "application/json",
           "wsgi.input": io.BytesIO(rq.body), "HTTP_X_ACCOUNT": rq.account, "HTTP_X_THEN": rq.then,
           "HTTP_AUTHORIZATION": "Bearer " + rq.account}
    if rq.keys:
        env["HTTP_IDEMPOTENCY_KEY"] = ", ".join(rq.keys)
    if rq.content_length() is None:
        env["wsgi.input_terminated"] = True
    else:
        env["CONTENT_LENGTH"] = str(rq.content_length())
    setup_testing_defaults(env)
    return env


def answered(response, read):
    response.read = read  # the bytes of the body the adapter took from the server
    return response


async def handler(adapter, ctx, then, size):
    """Every adapter's handler: a ledger row in the claim's transaction, then what ``then`` says.  ``size``: the
    bytes of the body the handler got, sent back as X-Body-Size."""
    await aw(adapter.write(ctx))
    if then == "db-error":
        await aw(adapter.execute(ctx, "SELECT 1/0"))
    if then in adapter.raises:
        raise adapter.raises[then]()
    if then == "not-executed":
        raise NotExecuted(problem(409, "conflict", "Conflict"))
    if then == "mark":
        ctx.not_executed = True
        return problem(422, "invalid", "Invalid")
    r = ANSWERS[then]
    return Response(r.status, r.headers + [("X-Body-Size", str(size))], r.body)


class Wsgi:
    chunked_read = MAX_BODY_BYTES + 1  # a body without length: read up to one byte over the limit
    expect = dict(EXPECT, **{"error-4xx": (422, b"/declined"), "error-5xx": (502, b"/bad-gateway"),
                             "restart-500": (500, b"failed")})
    raises = {"error-4xx": lambda: HTTPProblem(422, "declined", "Declined", "after the write"),
              "error-5xx": lambda: HTTPProblem(502, "bad-gateway", "Bad Gateway"),
              "crash": lambda: RuntimeError("boom")}

    def __init__(self, pool, **mode):
        self.mw = IdempotencyMiddleware(self.app, pool, scope=lambda e: e["HTTP_X_ACCOUNT"], **mode)

    def write(self, ctx):
        return self.execute(ctx, INSERT, (ctx.scope, ctx.key))

    def execute(self, ctx, sql, params=None):
        return ctx.connection.execute(sql, params)

    def app(self, environ, start_response):
        then, ctx, size = environ["HTTP_X_THEN"], environ[CONTEXT], len(environ["wsgi.input"].read())
        if then == "restart-500":  # a 200 started, then an error: started again with exc_info and a 500
            self.write(ctx)
            start_response("200 OK", [("Content-Type", "text/plain")])
            try:
                raise ValueError("late")
            except ValueError:
                start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
            return [b"failed"]
        r = drive(handler(self, ctx, then, size))
        start_response(r.status_line(), r.wsgi_headers())
        return [r.body]

    def send(self, reqs):
        return [answered(run_wsgi(self.mw, env), env["wsgi.input"].tell()) for env in map(environ, reqs)]


class Asgi:
    chunked_read = MAX_BODY_BYTES + 65536  # up to the message (64 KiB) that passes the limit
    expect = dict(EXPECT, **{"error-4xx": (422, b"declined after the write"), "error-5xx": (503, b"after the write"),
                             "no-answer": (500, b'"status":500')})

    def __init__(self, backend, database_url):
        from fastapi import HTTPException
        from starlette.exceptions import HTTPException as StarletteHTTPException

        self.backend, self.database_url = backend, database_url
        self.raises = {"error-4xx": lambda: StarletteHTTPException(422, "declined after the write"),
                       "error-5xx": lambda: HTTPException(503, "after the write"),
                       "crash": lambda: RuntimeError("boom")}

    def write(self, ctx):
        return self.execute(ctx, INSERT, (ctx.scope, ctx.key))

    def execute(self, ctx, sql, params=None):
        if self.backend == "psycopg":
            return ctx.connection.execute(sql, params)
        from starlette.concurrency import run_in_threadpool
        return run_in_threadpool(ctx.session.connection().exec_driver_sql, sql, params)

    def app(self):
        from fastapi import FastAPI, Request
        from pydantic import BaseModel, StrictInt
        from starlette.responses import PlainTextResponse, Response as StarletteResponse

        from idempotency_pg.asgi import CONTEXT as ASGI_CONTEXT, get_context, not_executed_on_validation_errors

        class Payment(BaseModel):
            amount_cents: StrictInt
            currency: str

        app = FastAPI()
        not_executed_on_validation_errors(app)

        @app.post("/t")
        @app.post("/t/{rest:path}")
        async def t(request: Request):
            r = await handler(self, get_context(request), request.headers["x-then"], len(await request.body()))
            return StarletteResponse(r.body, r.status, dict(r.headers))

        @app.post("/pay", status_code=201)
        async def pay(payment: Payment, request: Request):
            await self.write(get_context(request))
            return {"amount_cents": payment.amount_cents}

        @app.post("/plain")
        async def plain():
            return PlainTextResponse("plain", 201)

        async def asgi(scope, receive, send):
            if (b"x-then", b"no-answer") in scope["headers"]:
                return await self.write(scope[ASGI_CONTEXT])  # and no response at all
            await app(scope, receive, send)
        return asgi

    async def make_backend(self):
        from idempotency_pg.asgi import PsycopgBackend, SQLAlchemyBackend, async_connection_pool

        if self.backend == "psycopg":
            pool = async_connection_pool(self.database_url, min_size=1, max_size=4)
            await pool.open(wait=True, timeout=30)
            return PsycopgBackend(pool), pool.close
        from sqlalchemy import create_engine
        from sqlalchemy.orm import sessionmaker

        engine = create_engine(self.database_url.replace("postgresql://", "postgresql+psycopg2://", 1), future=True)

        async def close():
            engine.dispose()
        return SQLAlchemyBackend(sessionmaker(engine, future=True)), close

    def send(self, reqs, **options):
        from idempotency_pg.asgi import IdempotencyASGIMiddleware

        async def main():
            backend, close = await self.make_backend()
            mw = IdempotencyASGIMiddleware(self.app(), backend, **options,
                                           scope=lambda s: dict(s["headers"])[b"x-account"].decode())
            try:
                return [await asgi_request(mw, rq) for rq in reqs]
            finally:
                await close()
        return asyncio.run(main())


async def asgi_request(app, rq):
    """Hand ``rq`` to an ASGI app as a server does: the body in ``http.request`` messages of 64 KiB, and a body cut
    short of its Content-Length followed by ``http.disconnect``."""
    headers = [(b"x-account", rq.account.encode()), (b"x-then", rq.then.encode()),
               (b"content-type", b"application/json")] + [(b"idempotency-key", k.encode()) for k in rq.keys]
    if rq.content_length() is not None:
        headers.append((b"content-length", b"%d" % rq.content_length()))
    messages = [{"type": "http.request", "body": rq.body[i:i + 65536], "more_body": True}
                for i in range(0, max(len(rq.body), 1), 65536)]
    messages[-1]["more_body"] = (rq.content_length() or 0) > len(rq.body)
    got, start, read = [], {}, [0]

    async def receive():
        message = messages.pop(0) if messages else {"type": "http.disconnect"}
        read[0] += len(message.get("body", b""))
        return message

    async def send(message):
        if message["type"] == "http.response.start":
            start.update(status=message["status"], headers=[(k.decode(), v.decode()) for k, v in message["headers"]])
        else:
            got.append(message.get("body", b""))

    target, path, query = rq.raw()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path.decode(), "raw_path": target.partition("?")[0].encode(), "root_path": "",
             "query_string": query.encode(),
             "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return answered(Response(start["status"], start["headers"], b"".join(got)), read[0])


class Django:
    expect = dict(EXPECT, **{"error-4xx": (403, b"403 Forbidden"), "error-5xx": (503, b"/down")})

    def __init__(self):
        from django.core.exceptions import PermissionDenied

        from idempotency_pg.django import idempotent

        self.view = idempotent(scope=lambda request: request.META["HTTP_X_ACCOUNT"])(self.app)
        self.raises = {"error-4xx": lambda: PermissionDenied("after the write"),  # Django's own answer: 403
                       "error-5xx": lambda: HTTPProblem(503, "down", "Down"), "crash": lambda: RuntimeError("boom")}

    def write(self, ctx):  # with the ORM, on Django's connection in the claim's transaction
        from payments_service.djangoledger.models import Ledger

        Ledger.objects.create(account=ctx.scope, amount_cents=-1, currency="EUR", idempotency_key=ctx.key)

    def execute(self, ctx, sql):
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(sql)

    def app(self, request):
        from idempotency_pg.django import to_django

        return to_django(drive(handler(self, request.idempotency, request.META["HTTP_X_THEN"], len(request.body))))

    def send(self, reqs):
        from django.core.handlers.wsgi import WSGIRequest

        from idempotency_pg.django import from_django

        return [answered(from_django(self.view(WSGIRequest(env))), env["wsgi.input"].tell())
                for env in map(environ, reqs)]


ADAPTERS = {"wsgi": Wsgi, "wsgi-separate": Wsgi, "wsgi-unprepared": Wsgi, "asgi-psycopg": Asgi,
            "asgi-sqlalchemy": Asgi, "django": Django}
ASGI = ["asgi-psycopg", "asgi-sqlalchemy"]


@pytest.fixture(params=list(ADAPTERS))
def adapter(request, database_url, pool):
    name = request.param
    if name.startswith("wsgi"):
        modes = {"wsgi": {}, "wsgi-separate": {"combine": False}, "wsgi-unprepared": {"prepare": False}}
        return Wsgi(pool, **modes[name])
    if name.startswith("asgi"):
        return Asgi(name[5:], database_url)
    request.getfixturevalue("django_configured")
    return Django()


@pytest.mark.parametrize("then", ["created", "text", "binary"])
def test_the_answer_is_stored_as_sent_and_replayed_byte_for_byte(adapter, db, account, then):
    first, again = adapter.send([Req(account, then), Req(account, then)])
    want = ANSWERS[then]
    assert (first.status, first.body, first.header("Idempotent-Replayed")) == (want.status, want.body, None), first
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (want.status, want.body, "true"), again
    for r in (first, again):
        assert int(r.header("Content-Length")) == len(r.body)
        for name in ("Content-Type", "Location"):
            assert r.header(name) == want.header(name), name
    assert len(ledger(db, account)) == 1


def test_the_query_string_and_the_body_are_in_the_fingerprint(adapter, db, account):
    """A retry of ?ref=1 as ?ref=2 or with another body is another request (422); ?ref=1 again replays; no query at
    all is 1.2's fingerprint (the body hashed as JSON), another request again."""
    first, other, body, again, bare = adapter.send([Req(account, query="ref=1"), Req(account, query="ref=2"),
                                                    Req(account, query="ref=1", body=b'{"amount_cents": 2}'),
                                                    Req(account, query="ref=1"), Req(account)])
    assert first.status == 201 and first.header("Idempotent-Replayed") is None
    assert other.status == body.status == bare.status == 422
    assert json.loads(body.body)["type"].endswith("/idempotency-key-reused")
    assert again.header("Idempotent-Replayed") == "true" and again.body == first.body
    assert len(ledger(db, account)) == 1
    same = db.execute("SELECT encode(request_hash, 'hex') = idem_fingerprint('POST', '/t', 'ref=1', NULL, %s) "
                      "FROM idempotency_keys WHERE scope = %s AND key = 'k'", (PAY, account))
    assert same.fetchone() == (True,)


def fingerprint_is(db, account, key, path, query=None, body=PAY):
    return db.execute("SELECT encode(request_hash, 'hex') = idem_fingerprint('POST', %s, %s, NULL, %s) "
                      "FROM idempotency_keys WHERE scope = %s AND key = %s", (path, query, body, account, key)
                      ).fetchone() == (True,)


def test_the_path_is_fingerprinted_as_the_request_line_has_it(adapter, db, account):
    """CONTRACT.md "raw-target": the path undecoded, as sent.  /t/a%2Fb and /t/a/b are two requests (one key: a
    422), so are /t/%41 and /t/A; a trailing ? is no query (a replay); each stored fingerprint is the one of the
    target as sent."""
    a = dict(keys=("a",))
    b = dict(keys=("b",))
    c = dict(keys=("c",))
    first, slash, again, upper, letter, space, q = adapter.send([
        Req(account, target="/t/a%2Fb", **a), Req(account, target="/t/a/b", **a), Req(account, target="/t/a%2Fb?", **a),
        Req(account, target="/t/%41", **b), Req(account, target="/t/A", **b),
        Req(account, target="/t/caf%C3%A9%20x", **c), Req(account, target="/t/x?q=a%2Fb&r", keys=("d",))])
    assert first.status == upper.status == space.status == q.status == 201, (first, upper, space, q)
    assert slash.status == letter.status == 422, (slash, letter)
    assert json.loads(slash.body)["type"].endswith("/idempotency-key-reused")
    assert again.header("Idempotent-Replayed") == "true" and again.body == first.body
    assert fingerprint_is(db, account, "a", "/t/a%2Fb") and fingerprint_is(db, account, "b", "/t/%41")
    assert fingerprint_is(db, account, "c", "/t/caf%C3%A9%20x")
    assert fingerprint_is(db, account, "d", "/t/x", "q=a%2Fb&r")
    assert len(ledger(db, account)) == 4


def test_the_frameworks_own_4xx_after_a_write_is_stored_as_sent(adapter, db, account):
    first, again = adapter.send([Req(account, "error-4xx")] * 2)
    status, part = adapter.expect["error-4xx"]
    assert first.status == status and part in first.body, first
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (status, first.body, "true")
    assert len(ledger(db, account)) == 1


@pytest.mark.parametrize("adapter,then", [(name, then) for name, cls in ADAPTERS.items() for then, (status, _) in
                                          cls.expect.items() if status >= 500], indirect=["adapter"])
def test_an_error_after_a_write_rolls_back(adapter, db, account, then):
    """A 5xx answered (a framework's error, the handler's own 5xx, an exception, a database error, a WSGI app
    that started again with exc_info, an ASGI app that sent nothing): not stored, the write undone, the key free."""
    (r,) = adapter.send([Req(account, then)])
    status, part = adapter.expect[then]
    assert r.status == status and part in r.body, r
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


@pytest.mark.parametrize("then", ["not-executed", "mark"])
def test_not_executed_is_sent_not_stored(adapter, db, account, then):
    """``raise NotExecuted(response)`` or ``context.not_executed = True``: sent, not stored, the write undone."""
    first, again = adapter.send([Req(account, then)] * 2)
    status, part = adapter.expect[then]
    assert first.status == again.status == status and part in first.body, first
    assert again.header("Idempotent-Replayed") is None
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


def test_several_key_lines_are_400(adapter, account):
    (r,) = adapter.send([Req(account, keys=("a", "b"))])
    assert r.status == 400 and json.loads(r.body)["type"].endswith("/idempotency-key-invalid"), r
    assert "several" in json.loads(r.body)["detail"]


@pytest.mark.parametrize("body", [b'{"x": "\\u0000"}', b'{"x": "\\ud800"}'], ids=["nul", "lone-surrogate"])
def test_a_body_postgres_refuses_is_400_and_consumes_no_key(adapter, db, account, body):
    """JSON that jsonb refuses (a NUL, a lone surrogate) fails the claim: 400, nothing claimed, nothing run."""
    (r,) = adapter.send([Req(account, body=body)])
    assert r.status == 400 and json.loads(r.body)["type"].endswith("/request-body-not-json"), r
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


def padded(size):
    return PAY[:-1] + b" " * (size - len(PAY)) + b"}"


# Django has no chunked case: its server (waitress) reads a chunked body whole and hands it over with its length.
@pytest.mark.parametrize("adapter,chunked", [(name, chunked) for name in ADAPTERS for chunked in (False, True)
                                             if not (chunked and name == "django")], indirect=["adapter"])
def test_a_body_over_the_limit_is_413_before_it_is_read(adapter, db, account, chunked):
    """A Content-Length over the limit is refused with nothing read; a body without one is read only up to the
    limit (an ASGI server's message of 64 KiB at a time).  Exactly the limit passes, whole: the 413s did not
    consume the key."""
    length = None if chunked else "whole"
    big, over, exact = adapter.send([Req(account, body=padded(n), length=length)
                                     for n in (10 * 1024 * 1024, MAX_BODY_BYTES + 1, MAX_BODY_BYTES)])
    assert big.status == over.status == 413 and json.loads(big.body)["type"].endswith("/request-too-large"), big
    assert big.read <= adapter.chunked_read if chunked else big.read == 0, big.read
    assert exact.status == 201 and exact.header("X-Body-Size") == str(MAX_BODY_BYTES), exact
    assert len(ledger(db, account)) == 1


def test_a_truncated_body_is_not_executed(adapter, db, account):
    """Content-Length 600, then 37 bytes (a whole JSON payment) and the client is gone: nothing claimed."""
    (r,) = adapter.send([Req(account, body=b'{"amount_cents":100,"currency":"EUR"}', length=600)])
    assert r.status == 400 and json.loads(r.body)["type"].endswith("/request-body-incomplete"), r
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


# --------------------------------------------------------------------------- ASGI only

@pytest.mark.parametrize("adapter", ASGI, indirect=True)
def test_fastapi_validation_error_is_not_executed(adapter, db, account):
    bad = b'{"amount_cents": "12", "currency": "EUR"}'
    r1, r2, fixed, again = adapter.send([Req(account, path="/pay", body=bad)] * 2 + [Req(account, path="/pay")] * 2)
    assert r1.status == r2.status == 422 and r2.header("Idempotent-Replayed") is None
    assert fixed.status == 201 and fixed.header("Idempotent-Replayed") is None
    assert again.status == 201 and again.header("Idempotent-Replayed") == "true" and again.body == fixed.body
    assert len(ledger(db, account)) == 1


@pytest.mark.parametrize("adapter", ASGI, indirect=True)
def test_other_paths_pass_through(adapter, account):
    (r,) = adapter.send([Req(account, path="/plain", keys=())], when=lambda scope: scope["path"] != "/plain")
    assert (r.status, r.body) == (201, b"plain")  # no key needed: the middleware did not apply



# --------------------------------------------------------------------------- Django only

def test_the_django_service_view_validation_is_not_executed(django_configured, db, account):
    """The sample service's view (its ORM insert) behind the decorator: an invalid payment is not executed, so the
    corrected retry with the same key runs."""
    from django.core.handlers.wsgi import WSGIRequest

    from payments_service.django_app import payments

    def pay(amount):
        return payments(WSGIRequest(environ(Req(account, body=b'{"amount_cents": %d, "currency": "EUR"}' % amount))))
    assert pay(0).status_code == 422
    assert pay(5).status_code == 201
    assert [row[1] for row in ledger(db, account)] == [-5]
