"""The payment service of clients/CONTRACT.md as a WSGI app."""

import json
import logging
import re

from idempotency_pg import (
    CONNECTION,
    KEY,
    SCOPE,
    BodyTooLarge,
    HTTPProblem,
    IdempotencyMiddleware,
    NotExecuted,
    json_response,
    problem,
)
from idempotency_pg.middleware import read_body
from idempotency_pg.responses import MAX_BODY_BYTES, body_too_large, parse_json_body

log = logging.getLogger("payments_service")

ACCOUNT_RE = re.compile(r"[a-z0-9_]{1,64}\Z")
CURRENCY_RE = re.compile(r"[A-Z]{3}\Z")
BEARER_RE = re.compile(r"[ \t]*bearer[ \t]+(\S+)[ \t]*\Z", re.IGNORECASE)
SLEEP_RE = re.compile(r"sleep=(\d{1,7})\Z")
MAX_CENTS = 2 ** 63 - 1


def account_scope(environ):
    """The account of a WSGI request: :func:`account_from_authorization`."""
    return account_from_authorization(environ.get("HTTP_AUTHORIZATION", ""))


def account_from_authorization(value):
    """The account from an ``Authorization: Bearer <account>`` value; the idempotency scope.  401 otherwise."""
    m = BEARER_RE.match(value or "")
    if not m or not ACCOUNT_RE.match(m.group(1)):
        raise HTTPProblem(401, "unauthorized", "Unauthorized",
                          "send Authorization: Bearer <account>, the account being [a-z0-9_]{1,64}",
                          [("WWW-Authenticate", "Bearer")])
    return m.group(1)


def validate_payment(raw_body):
    """``(amount, currency)`` from the body, or :class:`NotExecuted` with a 422: validation happens before any write,
    so it is not stored and the corrected retry may use the same key (clients/CONTRACT.md "not-executed")."""
    body = json.loads(raw_body)
    amount = body.get("amount_cents") if isinstance(body, dict) else None
    currency = body.get("currency") if isinstance(body, dict) else None
    if type(amount) is not int or not 0 < amount <= MAX_CENTS:
        raise NotExecuted(problem(422, "invalid-payment", "Invalid payment",
                                  "amount_cents must be an integer greater than 0"))
    if not isinstance(currency, str) or not CURRENCY_RE.match(currency):
        raise NotExecuted(problem(422, "invalid-payment", "Invalid payment", "currency must be 3 upper-case letters"))
    return amount, currency


def process_payment(conn, account, key, raw_body, fault=None):
    """The handler, inside the caller's open transaction on ``conn``: returns a Response (raises
    :class:`NotExecuted` for an invalid body, :class:`HTTPProblem` for the ``throw-*`` faults)."""
    amount, currency = validate_payment(raw_body)
    (payment_id,) = conn.execute(
        "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) "
        "VALUES (%s::text, %s::bigint, %s::text, %s::text) RETURNING id",
        (account, -amount, currency, key),
    ).fetchone()
    if fault == "503":
        return problem(503, "upstream-unavailable", "Service Unavailable", "upstream unavailable")
    if fault in ("throw-422", "throw-502"):  # the error boundary's own answer, after the write
        status = int(fault[-3:])
        raise HTTPProblem(status, "thrown-%d" % status, "Thrown %d" % status, "the handler raised after its write")
    if fault == "db-error":
        conn.execute("SELECT 1/0")  # SQLSTATE 22012: the transaction fails
    elif fault:
        m = SLEEP_RE.match(fault)
        if m:
            conn.execute("SELECT pg_sleep(%s::int / 1000.0)", (int(m.group(1)),))
    location = "/payments/%d" % payment_id
    return json_response(
        201,
        {"payment_id": payment_id, "account": account, "amount_cents": amount, "currency": currency},
        [("Location", location)],
    )


def _send(start_response, response):
    start_response(response.status_line(), response.wsgi_headers())
    return [response.body]


class PaymentsApp:
    """Routes: POST /payments (idempotent), POST /rides (lease mode), POST /payments-unprotected, GET /healthz."""

    def __init__(self, pool, faults=False):
        self.pool = pool
        self.faults = faults
        self.protected = IdempotencyMiddleware(self.payments_handler, pool, scope=account_scope, methods=("POST",))

    def _fault(self, environ):
        if not self.faults:
            return None
        return environ.get("HTTP_X_FAULT", "").strip() or None

    def payments_handler(self, environ, start_response):
        """Behind the middleware: the claim is made, the connection is in an open transaction."""
        response = process_payment(environ[CONNECTION], environ[SCOPE], environ[KEY], read_body(environ),
                                   self._fault(environ))
        return _send(start_response, response)

    def unprotected(self, environ):
        """The same handler and insert in one transaction, without any claim (the benchmark's baseline)."""
        try:
            account = account_scope(environ)
        except HTTPProblem as p:
            return p.response
        try:
            raw = read_body(environ, MAX_BODY_BYTES)
        except BodyTooLarge:
            return body_too_large(MAX_BODY_BYTES)
        try:
            parse_json_body(raw)
        except ValueError:
            return problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON")
        key = environ.get("HTTP_IDEMPOTENCY_KEY", "")
        try:
            with self.pool.connection() as conn:
                with conn.transaction():
                    try:
                        response = process_payment(conn, account, key, raw, self._fault(environ))
                    except NotExecuted as e:
                        raise _RollbackWith(e.response)
                    except HTTPProblem as e:
                        response = e.response
                    if response.status >= 500:
                        raise _RollbackWith(response)  # leaving the block by an exception rolls back
                return response
        except _RollbackWith as r:
            return r.response
        except Exception:
            log.exception("payments-unprotected failed")
            return problem(500, "internal-error", "Internal Server Error", "the request failed and was rolled back")

    def rides(self, environ):
        """POST /rides: lease mode (payments_service.rides)."""
        from idempotency_pg import parse_idempotency_key

        from .rides import REFUSED, Ride, handle_ride, refused
        try:
            account = account_scope(environ)
            key = parse_idempotency_key(environ.get("HTTP_IDEMPOTENCY_KEY"))
            ride = Ride(account, key, read_body(environ, MAX_BODY_BYTES), self._fault(environ))
        except REFUSED as e:
            return refused(e)
        return handle_ride(self.pool, ride)

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET").upper()
        if path == "/healthz":
            if method in ("GET", "HEAD"):
                return _send(start_response, json_response(200, {"ok": True}))
            return _send(start_response, _not_allowed("GET, HEAD"))
        if path == "/payments":
            if method == "POST":
                return self.protected(environ, start_response)
            return _send(start_response, _not_allowed("POST"))
        if path == "/rides":
            if method == "POST":
                return _send(start_response, self.rides(environ))
            return _send(start_response, _not_allowed("POST"))
        if path == "/payments-unprotected":
            if method == "POST":
                return _send(start_response, self.unprotected(environ))
            return _send(start_response, _not_allowed("POST"))
        return _send(start_response, problem(404, "not-found", "Not Found", "no route for %s" % path))


class _RollbackWith(Exception):
    def __init__(self, response):
        super().__init__(response.status)
        self.response = response


def _not_allowed(allow):
    return problem(405, "method-not-allowed", "Method Not Allowed", "use %s" % allow, [("Allow", allow)])
