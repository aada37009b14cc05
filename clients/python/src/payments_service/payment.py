"""What every sample service shares (clients/CONTRACT.md): the account from the bearer token, the body's
validation, the faults acted on after the ledger insert, the answers; and waitress with its body limit."""

import hashlib
import io
import json
import re
from http import HTTPStatus

from idempotency_pg import MAX_BODY_BYTES, HTTPProblem, NotExecuted, json_response, problem
from idempotency_pg.core import aw
from idempotency_pg.responses import body_too_large, parse_json_body

ACCOUNT_RE = re.compile(r"[a-z0-9_]{1,64}\Z")
CURRENCY_RE = re.compile(r"[A-Z]{3}\Z")
BEARER_RE = re.compile(r"[ \t]*bearer[ \t]+(\S+)[ \t]*\Z", re.IGNORECASE)
SLEEP_RE = re.compile(r"sleep=(\d{1,7})\Z")
MAX_CENTS = 2 ** 53 - 1
#: A form field's amount: the decimal integer literal JSON allows (no fraction, no exponent, no leading zero).
INT_RE = re.compile(r"-?(0|[1-9][0-9]*)\Z")
#: The media types the payment handler reads as a form (CONTRACT.md "any-body"); any other as JSON.
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
DOCUMENT_SQL = ("INSERT INTO documents (account, idempotency_key, content_type, body) "
                "VALUES (%s::text, %s::text, %s::text, %s::bytea) RETURNING id")
INSERT_SQL = ("INSERT INTO ledger (account, amount_cents, currency, idempotency_key) "
              "VALUES (%s::text, %s::bigint, %s::text, %s::text) RETURNING id")


def account_from_authorization(value):
    """The account from an ``Authorization: Bearer <account>`` value; the idempotency scope.  401 otherwise."""
    m = BEARER_RE.match(value or "")
    if not m or not ACCOUNT_RE.match(m.group(1)):
        raise HTTPProblem(401, "unauthorized", "Unauthorized",
                          "send Authorization: Bearer <account>, the account being [a-z0-9_]{1,64}",
                          [("WWW-Authenticate", "Bearer")])
    return m.group(1)


def is_form(content_type):
    """Whether a ``Content-Type`` value says a form or multipart body (the payment handler reads its fields)."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return (content_type or "").split(";", 1)[0].strip().lower() in FORM_TYPES


def not_json():
    """The payment handler's answer to a body it cannot read: not executed (the key is released)."""
    return NotExecuted(problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON"))


def json_payment(raw_body):
    """The payment's JSON body as a Python value, or :func:`not_json`."""
    try:
        return json.loads(parse_json_body(raw_body))
    except ValueError:
        raise not_json() from None


def wsgi_form(environ):
    """A form or multipart body's fields ``{name: value}`` (text), parsed from ``environ["wsgi.input"]`` as a
    WSGI app parses it (python-multipart, Starlette's parser), or :func:`not_json` if it cannot be read."""
    import multipart

    fields = {}
    headers = {"Content-Type": environ.get("CONTENT_TYPE", ""), "Content-Length": environ.get("CONTENT_LENGTH", "0")}
    try:
        multipart.parse_form(headers, environ["wsgi.input"],
                             lambda f: fields.__setitem__(f.field_name.decode("utf-8"),  # the last one wins,
                                                          (f.value or b"").decode("utf-8")),  # as in Starlette, Django
                             lambda f: None)
    except Exception:  # noqa: BLE001 - a body the parser refuses (bad boundary, bad UTF-8): not readable
        raise not_json() from None
    return fields


def payment_from_wsgi(environ):
    """``(amount, currency)`` of a WSGI request: its form fields or its JSON body (:func:`validate_payment`)."""
    if is_form(environ.get("CONTENT_TYPE")):
        return validate_payment(wsgi_form(environ), form=True)
    return validate_payment(json_payment(environ["wsgi.input"].read()))


def payment_from_bytes(content_type, raw):
    """``(amount, currency)`` of a body read whole (the middleware's ``params["raw"]``), as
    :func:`payment_from_wsgi`."""
    return payment_from_wsgi({"CONTENT_TYPE": content_type or "", "CONTENT_LENGTH": str(len(raw)),
                              "wsgi.input": io.BytesIO(raw)})


def validate_payment(body, form=False):
    """``(amount, currency)`` from the body (a JSON value, or with ``form`` a form's fields, text), or
    :class:`NotExecuted` with a 422: validation happens before any write, so it is not stored and the corrected
    retry may use the same key (clients/CONTRACT.md "not-executed")."""
    amount = body.get("amount_cents") if isinstance(body, dict) else None
    currency = body.get("currency") if isinstance(body, dict) else None
    if form and isinstance(amount, str):
        amount = int(amount) if INT_RE.match(amount) else None
    if type(amount) is not int or not 0 < amount <= MAX_CENTS:
        raise NotExecuted(problem(422, "invalid-payment", "Invalid payment",
                                  "amount_cents must be an integer greater than 0"))
    if not isinstance(currency, str) or not CURRENCY_RE.match(currency):
        raise NotExecuted(problem(422, "invalid-payment", "Invalid payment", "currency must be 3 upper-case letters"))
    return amount, currency


def thrown_problem(status):
    """The library's own HTTP error, for frameworks without one (WSGI, Django)."""
    return HTTPProblem(status, "http-%d" % status, HTTPStatus(status).phrase, "the handler raised after its write")


async def after_write(fault, execute, thrown=thrown_problem):
    """The ``X-Fault`` cases acted on after the ledger insert (``execute(sql, params)`` runs a statement in the
    request's transaction, sync or async): a Response to answer instead, or None to go on."""
    if fault == "503":
        return problem(503, "upstream-unavailable", "Service Unavailable", "upstream unavailable")
    if fault in ("throw-422", "throw-502"):
        raise thrown(int(fault[-3:]))  # the framework's own error, after the write
    if fault == "db-error":
        await aw(execute("SELECT 1/0", ()))  # SQLSTATE 22012: the transaction fails
    m = SLEEP_RE.match(fault or "")
    if m:
        await aw(execute("SELECT pg_sleep(%s::int / 1000.0)", (int(m.group(1)),)))
    return None


def created(payment_id, account, amount, currency):
    return json_response(201, {"payment_id": payment_id, "account": account, "amount_cents": amount,
                               "currency": currency}, [("Location", "/payments/%d" % payment_id)])


def document_created(document_id, content_type, raw):
    """``POST /documents``' answer (CONTRACT.md "any-body")."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return json_response(201, {"document_id": document_id, "content_type": content_type, "bytes": len(raw),
                               "sha256": hashlib.sha256(raw).hexdigest()},
                         [("Location", "/documents/%d" % document_id)])


def not_allowed(allow="POST"):
    return problem(405, "method-not-allowed", "Method Not Allowed", "use %s" % allow, [("Allow", allow)])


def not_found(path):
    return problem(404, "not-found", "Not Found", "no route for %s" % path)


def serve(app, port, threads):
    """Serve a WSGI app with waitress on 127.0.0.1:``port``.  waitress reads a request's whole body before the app
    runs, so its own ``max_request_body_size`` is set to the limit: a ``Content-Length`` over it is refused at once,
    without the body, and a chunked body as it passes it (waitress counts the chunks' framing too), with the
    middleware's 413 problem+json; a client that hangs up mid-body never reaches the app."""
    from waitress.channel import HTTPChannel
    from waitress.server import create_server
    from waitress.task import ErrorTask

    class ProblemErrorTask(ErrorTask):
        def execute(self):
            if self.request.error.code != 413:
                return super().execute()
            r = body_too_large(MAX_BODY_BYTES)
            self.status, self.close_on_finish, self.content_length = r.status_line(), True, len(r.body)
            self.response_headers.extend(r.headers + [("Connection", "close")])
            self.write(r.body)

    class Channel(HTTPChannel):
        error_task_class = ProblemErrorTask

    # waitress refuses a body of max_request_body_size bytes or more: the limit itself is accepted.  send_bytes=1:
    # what the app writes goes out at once (a replay, before its transaction's ROLLBACK).
    server = create_server(app, host="127.0.0.1", port=port, threads=threads, ident=None, send_bytes=1,
                           connection_limit=max(100, threads * 4), max_request_body_size=MAX_BODY_BYTES + 1)
    server.channel_class = Channel
    server.run()
