"""The payment service of clients/CONTRACT.md as a WSGI app."""

import logging

from idempotency_pg import HTTPProblem, IdempotencyMiddleware, NotExecuted, Response, json_response
from idempotency_pg.core import Rollback, drive, fetchone
from idempotency_pg.middleware import CONTEXT, read_body

from .payment import DOCUMENT_SQL, INSERT_SQL, account_from_authorization, after_write, created, document_created, \
    not_allowed, not_found, payment_from_bytes, payment_from_wsgi, thrown_problem
from .rides import handle_ride, ride_request

log = logging.getLogger("payments_service")


def account_scope(environ):
    """The account of a WSGI request: :func:`account_from_authorization`."""
    return account_from_authorization(environ.get("HTTP_AUTHORIZATION", ""))


async def store_document(conn, account, key, content_type, raw):
    """``POST /documents`` (CONTRACT.md "any-body"): the body, of any type, stored as it came."""
    (document_id,) = await fetchone(conn, DOCUMENT_SQL, (account, key, content_type, raw))
    return document_created(document_id, content_type, raw)


async def process_payment(conn, account, key, payment, fault=None, thrown=thrown_problem):
    """The handler, inside the caller's open transaction on ``conn`` (a psycopg connection, sync or async), with
    ``payment``, the body read and validated (``(amount, currency)``: :func:`payment_from_wsgi` raises
    :class:`NotExecuted` for an invalid body): returns a Response (raises ``thrown(status)`` for the ``throw-*``
    faults)."""
    amount, currency = payment
    (payment_id,) = await fetchone(conn, INSERT_SQL, (account, -amount, currency, key))
    return await after_write(fault, conn.execute, thrown) or created(payment_id, account, amount, currency)


def _send(start_response, response):
    start_response(response.status_line(), response.wsgi_headers())
    return [response.body]


class PaymentsApp:
    """Routes: POST /payments (idempotent), POST /documents (idempotent, any body), POST /files/<name> (the same
    as /payments, at another path: CONTRACT.md "raw-target"), POST /rides (lease
    mode), POST /payments-unprotected, GET /healthz."""

    def __init__(self, pool, faults=False):
        self.pool, self.faults = pool, faults
        self.protected = IdempotencyMiddleware(self.payments_handler, pool, scope=account_scope, methods=("POST",))

    def _fault(self, environ):
        return (environ.get("HTTP_X_FAULT", "").strip() or None) if self.faults else None

    def payments_handler(self, environ, start_response):
        """Behind the middleware: the claim is made, the connection is in an open transaction."""
        ctx = environ[CONTEXT]
        if environ.get("PATH_INFO") == "/documents":
            return _send(start_response, drive(store_document(ctx.connection, ctx.scope, ctx.key,
                                                              environ.get("CONTENT_TYPE") or None,
                                                              environ["wsgi.input"].read())))
        # the body as a WSGI app reads it, from wsgi.input: a form or multipart body's fields, else JSON
        return _send(start_response, drive(process_payment(ctx.connection, ctx.scope, ctx.key,
                                                           payment_from_wsgi(environ), self._fault(environ))))

    def _intake(self, environ, path, key=True):
        return drive(self.protected.intake(environ, "POST", path, environ.get("HTTP_IDEMPOTENCY_KEY"),
                                           lambda limit: read_body(environ, limit), need_key=key))

    def unprotected(self, environ):
        """The same handler and insert in one transaction, without any claim (the benchmark's baseline)."""
        params = self._intake(environ, "/payments-unprotected", key=False)
        if isinstance(params, Response):
            return params
        try:
            with self.pool.connection() as conn:
                with conn.transaction():
                    payment = payment_from_bytes(params["content_type"], params["raw"])
                    response = drive(process_payment(conn, params["scope"], "", payment, self._fault(environ)))
                    if response.status >= 500:
                        raise Rollback(response)  # leaving the block by an exception rolls back
            return response
        except (Rollback, NotExecuted, HTTPProblem) as e:
            return e.response
        except Exception:
            log.exception("payments-unprotected failed")
            return self.protected.failed()

    def rides(self, environ):
        """POST /rides: lease mode (payments_service.rides)."""
        ride = drive(ride_request(self.protected, environ, environ.get("HTTP_IDEMPOTENCY_KEY"),
                                  lambda limit: read_body(environ, limit), self._fault(environ)))
        return ride if isinstance(ride, Response) else handle_ride(self.pool, ride)

    def __call__(self, environ, start_response):
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET").upper()
        if path == "/healthz":
            ok = method in ("GET", "HEAD")
            return _send(start_response, json_response(200, {"ok": True}) if ok else not_allowed("GET, HEAD"))
        files = path.startswith("/files/") and len(path) > len("/files/")  # PATH_INFO is decoded: a%2Fb is a/b here
        if (path in ("/payments", "/documents") or files) and method == "POST":
            return self.protected(environ, start_response)
        routes = {"/payments": None, "/documents": None, "/rides": self.rides,
                  "/payments-unprotected": self.unprotected}
        if files:
            return _send(start_response, not_allowed())
        if path not in routes:
            return _send(start_response, not_found(path))
        return _send(start_response, routes[path](environ) if method == "POST" else not_allowed())
