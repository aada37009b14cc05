"""The payment service of clients/CONTRACT.md on FastAPI (Starlette, ASGI), in two variants:

* ``psycopg``: the middleware's :class:`PsycopgBackend`, psycopg 3's async connection from an async pool; the
  endpoint is ``async def`` and writes with ``await conn.execute(...)``;
* ``sqlalchemy``: :class:`SQLAlchemyBackend`, a SQLAlchemy 1.4 ``Session`` (psycopg2); the endpoint is ``def``
  (FastAPI runs it in a worker thread) and writes with the ORM (``session.add(Ledger(...))``).

``POST /rides`` (lease mode, :mod:`payments_service.rides`) is the same in both: ``lease.run_async`` on psycopg's
async pool.  Run with ``python -m payments_service.asgi_main psycopg|sqlalchemy``.
"""

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response as FastAPIResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from idempotency_pg import NotExecuted, Response, json_response, problem
from idempotency_pg.asgi import (IdempotencyASGIMiddleware, PsycopgBackend, SQLAlchemyBackend, async_connection_pool,
                                 get_context, read_body)
from idempotency_pg.core import drive

from .app import process_payment, store_document
from .payment import DOCUMENT_SQL, account_from_authorization, after_write, created, document_created, is_form, \
    json_payment, not_json, payment_from_bytes, validate_payment
from .rides import handle_ride_async, ride_request


def account_of(scope):
    """The account of an ASGI request (:func:`account_from_authorization`): the idempotency scope, else 401."""
    return account_from_authorization(next((v.decode("latin-1") for k, v in scope["headers"]
                                            if k.lower() == b"authorization"), ""))


def to_fastapi(response):
    return FastAPIResponse(response.body, status_code=response.status, headers=dict(response.headers))


async def payment_of(request):
    """``(amount, currency)`` of the request as FastAPI reads it: ``request.form()`` (Starlette's form and
    multipart parsers) when the Content-Type says a form, else ``request.body()`` as JSON
    (:func:`validate_payment`: NotExecuted if invalid)."""
    if is_form(request.headers.get("content-type")):
        try:
            form = await request.form()
        except Exception:  # noqa: BLE001 - a body Starlette's parser refuses
            raise not_json() from None
        return validate_payment(dict(form), form=True)
    return validate_payment(json_payment(await request.body()))


def thrown(status):
    return HTTPException(status, "the handler raised after its write")  # FastAPI's own error


def create_app(dsn, variant="psycopg", faults=False, pool_size=20):
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    mw = None  # the middleware around the app (below): its options read /rides and /payments-unprotected too

    def fault_of(request):
        return (request.headers.get("x-fault", "").strip() or None) if faults else None

    async def intake(request, path):
        """The request read as the middleware reads it (account, key, whole body, JSON, valid payment), or the
        Response refusing it."""
        return await mw.intake(request.scope, "POST", path, None, lambda limit: read_body(request.scope,
                               request.receive, limit), need_key=False)

    @app.exception_handler(StarletteHTTPException)
    async def http_problem(request, exc):
        """Every HTTP error as problem+json (404, 405 with Allow, the handler's own HTTPException)."""
        from http import HTTPStatus
        return to_fastapi(problem(exc.status_code, "http-%d" % exc.status_code, HTTPStatus(exc.status_code).phrase,
                                  str(exc.detail), list((exc.headers or {}).items())))

    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz():
        return to_fastapi(json_response(200, {"ok": True}))

    # psycopg 3's async pool: the psycopg variant's backend, and POST /rides (lease mode) in both variants.
    pool = async_connection_pool(dsn, min_size=min(4, pool_size), max_size=pool_size, timeout=10)

    @app.on_event("startup")
    async def open_pool():
        await pool.open(wait=True, timeout=30)

    @app.on_event("shutdown")
    async def close_pool():
        await pool.close()

    @app.post("/payments-unprotected")
    async def unprotected(request: Request):
        params = await intake(request, "/payments-unprotected")
        if isinstance(params, Response):
            return to_fastapi(params)
        try:
            return to_fastapi(await pay_unprotected(params["scope"], payment_from_bytes(params["content_type"],
                                                                                       params["raw"])))
        except NotExecuted as e:
            return to_fastapi(e.response)

    @app.post("/rides")
    async def rides(request: Request):
        ride = await ride_request(mw, request.scope, request.headers.getlist("idempotency-key") or None,
                                  lambda limit: read_body(request.scope, request.receive, limit), fault_of(request))
        return to_fastapi(ride if isinstance(ride, Response) else await handle_ride_async(pool, ride))

    if variant == "psycopg":
        backend = PsycopgBackend(pool)

        @app.post("/payments")
        @app.post("/files/{name:path}")  # CONTRACT.md "raw-target": /payments at another path
        async def payments(request: Request):
            ctx = get_context(request)
            payment = await payment_of(request)  # NotExecuted goes up to the middleware: sent, not stored
            return to_fastapi(await process_payment(ctx.connection, ctx.scope, ctx.key, payment,
                                                    fault_of(request), thrown))

        @app.post("/documents")
        async def documents(request: Request):
            ctx = get_context(request)
            return to_fastapi(await store_document(ctx.connection, ctx.scope, ctx.key,
                                                   request.headers.get("content-type"), await request.body()))

        async def pay_unprotected(account, payment):  # the same handler and insert, without any claim
            async with pool.connection() as conn:
                async with conn.transaction():
                    return await process_payment(conn, account, "", payment)

    elif variant == "sqlalchemy":
        from sqlalchemy import create_engine
        from sqlalchemy.orm import sessionmaker

        from .models import Ledger

        url = dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
        engine = create_engine(url, pool_size=pool_size, max_overflow=0, pool_pre_ping=False, future=True)
        Session = sessionmaker(engine, future=True, expire_on_commit=False)
        backend = SQLAlchemyBackend(Session)

        @app.on_event("startup")
        def warm():
            # Open the whole pool before /healthz answers (SQLAlchemy opens connections on demand otherwise, and
            # a first click that has to connect takes longer than the contract's 409 "at once"); fails fast if
            # the database is not there.
            conns = [engine.connect() for _ in range(pool_size)]
            for c in conns:
                c.exec_driver_sql("SELECT 1")
                c.close()
            with Session() as s:  # SQLAlchemy configures the mappers and compiles the INSERT at its first use
                s.add(Ledger(account="warm_up", amount_cents=0, currency="XXX", idempotency_key=""))
                s.flush()
                s.rollback()

        @app.on_event("shutdown")
        def dispose():
            engine.dispose()

        def pay(session, account, key, payment, fault=None):
            """The handler with the ORM, inside the caller's transaction in ``session``."""
            amount, currency = payment
            row = Ledger(account=account, amount_cents=-amount, currency=currency, idempotency_key=key)
            session.add(row)
            session.flush()  # the INSERT, in the claim's transaction
            return drive(after_write(fault, session.connection().exec_driver_sql, thrown)) or \
                created(row.id, account, amount, currency)

        @app.post("/payments")
        @app.post("/files/{name:path}")  # CONTRACT.md "raw-target": /payments at another path
        def payments(request: Request):  # def: FastAPI runs it in a thread, where the sync Session belongs
            from anyio import from_thread

            ctx = get_context(request)  # the body was read by the middleware: Starlette hands it over in the loop
            payment = from_thread.run(payment_of, request)  # NotExecuted goes up to the middleware
            return to_fastapi(pay(ctx.session, ctx.scope, ctx.key, payment, fault_of(request)))

        @app.post("/documents")
        def documents(request: Request):
            from anyio import from_thread

            ctx = get_context(request)
            raw, content_type = from_thread.run(request.body), request.headers.get("content-type")
            (document_id,) = ctx.session.connection().exec_driver_sql(
                DOCUMENT_SQL, (ctx.scope, ctx.key, content_type, raw)).fetchone()
            return to_fastapi(document_created(document_id, content_type, raw))

        async def pay_unprotected(account, payment):
            from starlette.concurrency import run_in_threadpool

            def write():
                with Session.begin() as s:
                    return pay(s, account, "", payment)
            return await run_in_threadpool(write)
    else:
        raise ValueError("variant must be psycopg or sqlalchemy, not %r" % (variant,))

    mw = IdempotencyASGIMiddleware(app, backend, scope=account_of, methods=("POST",),
                                   when=lambda s: s["path"] in ("/payments", "/documents")
                                   or s["path"].startswith("/files/"))
    return mw
