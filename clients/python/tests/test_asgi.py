"""The ASGI middleware (idempotency_pg.asgi) on Starlette and FastAPI, with both backends: psycopg 3's async
connection and a SQLAlchemy session.  Against a real database (IDEM_TEST_DATABASE_URL), in process via httpx.

Item 1 of issue 25: the status committed is the one sent at ASGI ``send``, after the framework's own error
handling; a handler that writes, then raises or returns an error, never commits a status it did not answer."""

import asyncio
import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from idempotency_pg import MAX_BODY_BYTES, NotExecuted, problem
from idempotency_pg.asgi import (
    IdempotencyASGIMiddleware,
    PsycopgBackend,
    SQLAlchemyBackend,
    async_connection_pool,
    get_context,
    mark_not_executed,
    not_executed_on_validation_errors,
)

from conftest import needs_db
from test_integration import ledger, stored_outcome

pytestmark = needs_db

INSERT = "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES (%s, -1, 'EUR', %s)"
PAY = b'{"amount_cents": 1, "currency": "EUR"}'


def tenant(scope):
    return dict(scope["headers"])[b"x-account"].decode()


async def insert(request):
    """The handler's write, on whichever backend the middleware gave it."""
    ctx = get_context(request)
    if hasattr(ctx.handle, "execute") and asyncio.iscoroutinefunction(ctx.handle.execute):
        await ctx.handle.execute(INSERT, (ctx.scope, ctx.key))
    else:
        from starlette.concurrency import run_in_threadpool
        await run_in_threadpool(ctx.handle.connection().exec_driver_sql, INSERT,
                                (ctx.scope, ctx.key))


async def ok(request):
    await insert(request)
    return Response(b'{"z": 1,  "a":[1,2.50]}', 201, media_type="application/json", headers={"Location": "/x/1"})


async def raise_422(request):
    await insert(request)
    raise HTTPException(422, "declined after the write")


async def raise_502(request):
    await insert(request)
    raise HTTPException(502, "upstream failed after the write")


async def return_500(request):
    await insert(request)
    return PlainTextResponse("failed", 500)


async def crash(request):
    await insert(request)
    raise RuntimeError("boom")


async def no_answer(scope, receive, send):
    pass  # an ASGI app that never sends a response


async def not_executed_raise(request):
    await insert(request)
    raise NotExecuted(problem(409, "conflict", "Conflict"))


async def not_executed_mark(request):
    await insert(request)
    mark_not_executed(request)
    return JSONResponse({"error": "invalid"}, 422)


async def echo_body(request):
    await insert(request)
    return JSONResponse({"size": len(await request.body())}, 201)


ROUTES = {"/ok": ok, "/raise-422": raise_422, "/raise-502": raise_502, "/return-500": return_500, "/crash": crash,
          "/not-executed-raise": not_executed_raise, "/not-executed-mark": not_executed_mark, "/echo": echo_body}


def starlette_app():
    app = Starlette(routes=[Route(p, f, methods=["POST"]) for p, f in ROUTES.items()]
                    + [Route("/no-answer", no_answer, methods=["POST"]),
       Route("/plain", lambda request: PlainTextResponse("plain", 201), methods=["POST"])])
    return app


@pytest.fixture(params=["psycopg", "sqlalchemy"])
def backend_factory(request, database_url):
    """A function making (backend, closer) for the backend under test."""
    if request.param == "psycopg":
        async def make():
            pool = async_connection_pool(database_url, min_size=1, max_size=4)
            await pool.open(wait=True, timeout=30)
            return PsycopgBackend(pool), pool.close
    else:
        from sqlalchemy import create_engine
        from sqlalchemy.orm import sessionmaker

        engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://", 1), future=True)

        async def make():
            async def close():
                engine.dispose()
            return SQLAlchemyBackend(sessionmaker(engine, future=True)), close
    make.kind = request.param
    return make


def call(backend_factory, app_factory, requests, **mw_kwargs):
    """Run the requests (path, key, account, body, extra headers) in order; returns the httpx responses."""
    async def go():
        backend, close = await backend_factory()
        mw = IdempotencyASGIMiddleware(app_factory(), backend, scope=tenant, **mw_kwargs)
        out = []
        try:
            async with httpx.AsyncClient(app=mw, base_url="http://test") as client:
                for path, key, account, body, headers in requests:
                    hs = [("X-Account", account), ("Content-Type", "application/json")]
                    if key is not None:
                        hs.append(("Idempotency-Key", key))
                    hs += list(headers)
                    out.append(await client.post(path, content=body, headers=hs))
        finally:
            await close()
        return out
    return asyncio.run(go())


def req(path, account, key="k", body=PAY, headers=()):
    return (path, key, account, body, headers)


def test_ok_then_byte_identical_replay(backend_factory, db, account):
    first, again = call(backend_factory, starlette_app, [req("/ok", account), req("/ok", account)])
    assert first.status_code == again.status_code == 201
    assert "idempotent-replayed" not in first.headers and again.headers["idempotent-replayed"] == "true"
    assert first.content == again.content, (first.content, again.content)
    assert json.loads(first.content) == {"z": 1, "a": [1, 2.5]}
    assert again.headers["location"] == first.headers["location"] == "/x/1"
    assert len(ledger(db, account)) == 1


def test_the_query_string_is_in_the_fingerprint(backend_factory, db, account):
    first, other, again = call(backend_factory, starlette_app, [req("/ok?ref=1", account), req("/ok?ref=2", account),
                                                                 req("/ok?ref=1", account)])
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    assert other.status_code == 422
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert len(ledger(db, account)) == 1


def test_http_exception_422_after_a_write_is_committed_as_sent(backend_factory, db, account):
    first, again = call(backend_factory, starlette_app, [req("/raise-422", account), req("/raise-422", account)])
    assert first.status_code == 422, first.content
    assert (again.status_code, again.content, again.headers.get("idempotent-replayed")) == \
        (422, first.content, "true")
    assert len(ledger(db, account)) == 1


@pytest.mark.parametrize("path,status", [("/raise-502", 502), ("/return-500", 500), ("/crash", 500),
                                         ("/no-answer", 500)])
def test_error_after_a_write_rolls_back(backend_factory, db, account, path, status):
    (r,) = call(backend_factory, starlette_app, [req(path, account)])
    assert r.status_code == status, r.content
    assert ledger(db, account) == []
    assert stored_outcome(db, account, "k") == "claimed"


@pytest.mark.parametrize("path,status", [("/not-executed-raise", 409), ("/not-executed-mark", 422)])
def test_not_executed_is_sent_not_stored(backend_factory, db, account, path, status):
    first, again = call(backend_factory, starlette_app, [req(path, account), req(path, account)])
    assert first.status_code == again.status_code == status
    assert "idempotent-replayed" not in again.headers
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


def test_several_key_lines_are_400(backend_factory, db, account):
    (r,) = call(backend_factory, starlette_app, [req("/ok", account, key="a", headers=[("Idempotency-Key", "b")])])
    assert r.status_code == 400 and r.json()["type"].endswith("/idempotency-key-invalid")
    assert "several" in r.json()["detail"]


def _padded(size):
    return PAY[:-1] + b" " * (size - len(PAY)) + b"}"


def test_body_limit(backend_factory, db, account):
    async def chunks(data):
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    async def chunked(size):  # no Content-Length: read only up to the limit
        backend, close = await backend_factory()
        mw = IdempotencyASGIMiddleware(starlette_app(), backend, scope=tenant)
        try:
            async with httpx.AsyncClient(app=mw, base_url="http://test") as client:
                return await client.post("/echo", content=chunks(_padded(size)),
                                         headers={"X-Account": account, "Idempotency-Key": "big"})
        finally:
            await close()

    big, over = call(backend_factory, starlette_app, [req("/echo", account, "big", _padded(10 * 1024 * 1024)),
                                                     req("/echo", account, "big", _padded(MAX_BODY_BYTES + 1))])
    assert big.status_code == over.status_code == 413
    assert big.json()["type"].endswith("/request-too-large")
    assert asyncio.run(chunked(MAX_BODY_BYTES + 1)).status_code == 413
    r = asyncio.run(chunked(MAX_BODY_BYTES))
    assert r.status_code == 201 and r.json() == {"size": MAX_BODY_BYTES}  # the 413s did not consume the key
    assert len(ledger(db, account)) == 1


def fastapi_app():
    from fastapi import FastAPI, Request
    from pydantic import BaseModel, StrictInt

    class Payment(BaseModel):
        amount_cents: StrictInt
        currency: str

    app = FastAPI()
    not_executed_on_validation_errors(app)

    @app.post("/pay", status_code=201)
    async def pay(payment: Payment, request: Request):
        await insert(request)
        return {"amount_cents": payment.amount_cents}

    @app.post("/fail")
    async def fail(request: Request):
        from fastapi import HTTPException as FastAPIHTTPException
        await insert(request)
        raise FastAPIHTTPException(status_code=503, detail="after the write")

    return app


def test_fastapi_validation_error_is_not_executed(backend_factory, db, account):
    bad = b'{"amount_cents": "12", "currency": "EUR"}'
    r1, r2, fixed, again = call(backend_factory, fastapi_app, [
        req("/pay", account, body=bad), req("/pay", account, body=bad), req("/pay", account),
        req("/pay", account)])
    assert r1.status_code == r2.status_code == 422 and "idempotent-replayed" not in r2.headers
    assert fixed.status_code == 201 and "idempotent-replayed" not in fixed.headers
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.content == fixed.content
    assert len(ledger(db, account)) == 1


def test_fastapi_http_exception_5xx_rolls_back(backend_factory, db, account):
    (r,) = call(backend_factory, fastapi_app, [req("/fail", account)])
    assert r.status_code == 503 and r.json() == {"detail": "after the write"}
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


def test_other_methods_and_paths_pass_through(backend_factory, db, account):
    (r,) = call(backend_factory, starlette_app, [req("/plain", account, key=None)],
                when=lambda scope: scope["path"] != "/plain")
    assert (r.status_code, r.content) == (201, b"plain")  # no key needed: the middleware did not apply
