"""The payment service of clients/CONTRACT.md on FastAPI (Starlette, ASGI), in two variants:

* ``psycopg``: the middleware's :class:`PsycopgBackend`, psycopg 3's async connection from an async pool; the
  endpoint is ``async def`` and writes with ``await conn.execute(...)``;
* ``sqlalchemy``: :class:`SQLAlchemyBackend`, a SQLAlchemy 1.4 ``Session`` (psycopg2); the endpoint is ``def``
  (FastAPI runs it in a worker thread) and writes with the ORM (``session.add(Ledger(...))``).

``POST /rides`` (lease mode, :mod:`payments_service.rides`) is the same in both: ``lease.run_async`` on psycopg's
async pool.  Run with ``python -m payments_service.asgi_main psycopg|sqlalchemy``.
"""

import logging

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response as FastAPIResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from idempotency_pg import HTTPProblem, NotExecuted, json_response, parse_idempotency_key, problem
from idempotency_pg.asgi import (
    IdempotencyASGIMiddleware,
    PsycopgBackend,
    SQLAlchemyBackend,
    async_connection_pool,
    get_context,
)
from idempotency_pg.responses import parse_json_body

from .app import SLEEP_RE, account_from_authorization, validate_payment
from .rides import REFUSED, Ride, handle_ride_async, refused

log = logging.getLogger("payments_service")

INSERT_SQL = ("INSERT INTO ledger (account, amount_cents, currency, idempotency_key) "
              "VALUES (%s::text, %s::bigint, %s::text, %s::text) RETURNING id")


def account_of(scope):
    """The account of an ASGI request (:func:`account_from_authorization`): the idempotency scope, else 401."""
    auth = ""
    for k, v in scope["headers"]:
        if k.lower() == b"authorization":
            auth = v.decode("latin-1")
    return account_from_authorization(auth)


def to_fastapi(response):
    return FastAPIResponse(response.body, status_code=response.status, headers=dict(response.headers))


def created(payment_id, account, amount, currency):
    return json_response(201, {"payment_id": payment_id, "account": account, "amount_cents": amount,
                               "currency": currency}, [("Location", "/payments/%d" % payment_id)])


def fault_after_write(fault):
    """The X-Fault cases acted on after the insert; returns a Response to answer, or None to go on."""
    if fault == "503":
        return problem(503, "upstream-unavailable", "Service Unavailable", "upstream unavailable")
    if fault in ("throw-422", "throw-502"):
        raise HTTPException(int(fault[-3:]), "the handler raised after its write")  # FastAPI's own error
    return None


def sleep_ms(fault):
    m = SLEEP_RE.match(fault or "")
    return int(m.group(1)) if m else None


def create_app(dsn, variant="psycopg", faults=False, pool_size=20):
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    def fault_of(request):
        return (request.headers.get("x-fault", "").strip() or None) if faults else None

    @app.exception_handler(StarletteHTTPException)
    async def http_problem(request, exc):
        """Every HTTP error as problem+json (404, 405 with Allow, the handler's own HTTPException)."""
        r = problem(exc.status_code, "http-%d" % exc.status_code, _phrase(exc.status_code), str(exc.detail),
                    list((exc.headers or {}).items()))
        return to_fastapi(r)

    @app.exception_handler(_Answer)
    async def answer(request, exc):
        return to_fastapi(exc.response)

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

    @app.post("/rides")
    async def rides(request: Request):
        try:
            account = account_of(request.scope)
            key = parse_idempotency_key(request.headers.getlist("idempotency-key") or None)
            ride = Ride(account, key, await request.body(), fault_of(request))
        except REFUSED as e:
            return to_fastapi(refused(e))
        return to_fastapi(await handle_ride_async(pool, ride))

    if variant == "psycopg":
        backend = PsycopgBackend(pool)

        @app.post("/payments")
        async def payments(request: Request):
            ctx = get_context(request)
            amount, currency = validate_payment(await request.body())
            cur = await ctx.connection.execute(INSERT_SQL, (ctx.scope, -amount, currency, ctx.key))
            (payment_id,) = await cur.fetchone()
            fault = fault_of(request)
            early = fault_after_write(fault)
            if early is not None:
                return to_fastapi(early)
            if fault == "db-error":
                await ctx.connection.execute("SELECT 1/0")
            if sleep_ms(fault) is not None:
                await ctx.connection.execute("SELECT pg_sleep(%s::int / 1000.0)", (sleep_ms(fault),))
            return to_fastapi(created(payment_id, ctx.scope, amount, currency))

        @app.post("/payments-unprotected")
        async def unprotected(request: Request):
            account, amount, currency = await _unprotected_input(request)
            async with pool.connection() as conn:
                async with conn.transaction():
                    cur = await conn.execute(INSERT_SQL, (account, -amount, currency, ""))
                    (payment_id,) = await cur.fetchone()
            return to_fastapi(created(payment_id, account, amount, currency))

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

        @app.post("/payments")
        def payments(request: Request):  # def: FastAPI runs it in a thread, where the sync Session belongs
            ctx = get_context(request)
            amount, currency = validate_payment(_body_of(request))
            row = Ledger(account=ctx.scope, amount_cents=-amount, currency=currency, idempotency_key=ctx.key)
            ctx.session.add(row)
            ctx.session.flush()  # the INSERT, in the claim's transaction
            fault = fault_of(request)
            early = fault_after_write(fault)
            if early is not None:
                return to_fastapi(early)
            if fault == "db-error":
                ctx.session.connection().exec_driver_sql("SELECT 1/0")
            if sleep_ms(fault) is not None:
                ctx.session.connection().exec_driver_sql("SELECT pg_sleep(%(ms)s::int / 1000.0)",
                                                         {"ms": sleep_ms(fault)})
            return to_fastapi(created(row.id, ctx.scope, amount, currency))

        @app.post("/payments-unprotected")
        async def unprotected(request: Request):
            account, amount, currency = await _unprotected_input(request)
            from starlette.concurrency import run_in_threadpool

            def write():
                with Session.begin() as s:
                    row = Ledger(account=account, amount_cents=-amount, currency=currency, idempotency_key="")
                    s.add(row)
                    s.flush()
                    return row.id
            payment_id = await run_in_threadpool(write)
            return to_fastapi(created(payment_id, account, amount, currency))
    else:
        raise ValueError("variant must be psycopg or sqlalchemy, not %r" % (variant,))

    return IdempotencyASGIMiddleware(app, backend, scope=account_of, methods=("POST",),
                                     when=lambda scope: scope["path"] == "/payments")


def _body_of(request):
    """The request body in a sync endpoint: the middleware has read it already and hands it over in one message,
    so Starlette's ``request.body()`` would need the event loop; read it through the loop's thread instead."""
    from anyio import from_thread

    return from_thread.run(request.body)


async def _unprotected_input(request):
    """``(account, amount, currency)`` of a /payments-unprotected request, or :class:`_Answer` with the refusal."""
    try:
        account = account_of(request.scope)
        raw = await request.body()
        if len(raw) > 1024 * 1024:
            raise _Answer(problem(413, "request-too-large", "Request body too large", "over 1048576 bytes"))
        parse_json_body(raw)
        return (account,) + validate_payment(raw)
    except (HTTPProblem, NotExecuted) as p:
        raise _Answer(p.response) from None
    except ValueError:
        raise _Answer(problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON"))


class _Answer(Exception):
    def __init__(self, response):
        super().__init__(response.status)
        self.response = response


def _phrase(status):
    from http import HTTPStatus
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"

