"""The WSGI middleware against clients/CONTRACT.md "Contract 2": the status committed is the one the app answered,
not-executed, byte-identical replays, the body limit, several keys, and both ways of sending the statements."""

import io
import json
import sys

import pytest

from idempotency_pg import CONNECTION, MAX_BODY_BYTES, HTTPProblem, IdempotencyMiddleware, NotExecuted
from idempotency_pg.responses import problem
from payments_service import account_scope

from conftest import needs_db
from test_integration import ledger, pay, stored_outcome
from wsgi_client import body_json, request

INSERT = "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES (%s, -1, 'EUR', %s)"


def writer(then):
    """A WSGI app that inserts a ledger row, then does ``then(start_response)``."""
    def app(environ, start_response):
        environ[CONNECTION].execute(INSERT, (environ["idempotency_pg.scope"], environ["idempotency_pg.key"]))
        return then(start_response)
    return app


@needs_db
@pytest.mark.parametrize("mode", [{}, {"combine": False}, {"prepare": False}],
                         ids=["pipelined-prepared", "separate", "unprepared"])
def test_error_raised_after_a_write_422_is_committed_as_sent(pool, db, account, mode):
    def then(start_response):
        raise HTTPProblem(422, "declined", "Declined", "after the write")
    mw = IdempotencyMiddleware(writer(then), pool, scope=account_scope, **mode)
    r = pay(mw, account, "w")
    assert r.status == 422 and body_json(r)["type"].endswith("/declined")
    assert len(ledger(db, account)) == 1
    again = pay(mw, account, "w")
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (422, r.body, "true")


@needs_db
def test_error_raised_after_a_write_502_rolls_back(pool, db, account):
    def then(start_response):
        raise HTTPProblem(502, "bad-gateway", "Bad Gateway")
    mw = IdempotencyMiddleware(writer(then), pool, scope=account_scope)
    assert pay(mw, account, "w").status == 502
    assert ledger(db, account) == []
    assert stored_outcome(db, account, "w") == "claimed"


@needs_db
def test_error_after_start_response_uses_the_last_status(pool, db, account):
    """A WSGI app that started a 200, then hit an error and restarted with exc_info and a 500: rolled back."""
    def then(start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        try:
            raise ValueError("late")
        except ValueError:
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"failed"]
    mw = IdempotencyMiddleware(writer(then), pool, scope=account_scope)
    r = pay(mw, account, "w")
    assert (r.status, r.body) == (500, b"failed")
    assert ledger(db, account) == []


@needs_db
def test_not_executed_after_a_write_undoes_it(pool, db, account):
    def then(start_response):
        raise NotExecuted(problem(409, "conflict", "Conflict"))
    mw = IdempotencyMiddleware(writer(then), pool, scope=account_scope)
    assert pay(mw, account, "w").status == 409
    assert ledger(db, account) == [] and stored_outcome(db, account, "w") == "claimed"


@needs_db
@pytest.mark.parametrize("mode", [{}, {"combine": False}, {"prepare": False}],
                         ids=["pipelined-prepared", "separate", "unprepared"])
def test_replay_is_byte_identical(pool, db, account, mode):
    """The handler's JSON has its own spacing and key order: stored as sent, so every replay is those bytes."""
    def then(start_response):
        body = b'{"z": 1,   "a": [1, 2.50, "x"], "m": {"b": null, "aa": true}}'
        start_response("201 Created", [("Content-Type", "application/json"), ("Location", "/x/1")])
        return [body]
    mw = IdempotencyMiddleware(writer(then), pool, scope=account_scope, **mode)
    first = pay(mw, account, "b")
    again = pay(mw, account, "b")
    assert first.status == again.status == 201
    assert again.header("Idempotent-Replayed") == "true"
    assert first.body == again.body, (first.body, again.body)
    assert json.loads(first.body) == {"z": 1, "a": [1, 2.5, "x"], "m": {"b": None, "aa": True}}
    assert int(first.header("Content-Length")) == len(first.body)
    assert again.header("Location") == first.header("Location") == "/x/1"


@needs_db
def test_text_body_is_replayed_as_sent(pool, db, account):
    def then(start_response):
        start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"  spaced\n text  "]
    mw = IdempotencyMiddleware(writer(then), pool, scope=account_scope)
    assert pay(mw, account, "t").body == pay(mw, account, "t").body == b"  spaced\n text  "


def _big_request(app, account, key, size, content_length=True):
    body = b'{"amount_cents": 100, "currency": "EUR"' + b" " * (size - 40) + b"}"
    assert len(body) == size
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/payments", "wsgi.input": io.BytesIO(body),
               "CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": "Bearer " + account,
               "HTTP_IDEMPOTENCY_KEY": key}
    if content_length:
        environ["CONTENT_LENGTH"] = str(size)
    else:
        environ["wsgi.input_terminated"] = True
    from wsgiref.util import setup_testing_defaults
    from idempotency_pg import run_wsgi
    setup_testing_defaults(environ)
    return run_wsgi(app, environ), environ["wsgi.input"]


@needs_db
@pytest.mark.parametrize("content_length", [True, False], ids=["content-length", "chunked"])
def test_body_limit_is_413(pool, db, account, content_length):
    from payments_service import PaymentsApp
    app = PaymentsApp(pool)
    r, stream = _big_request(app, account, "big", 10 * 1024 * 1024, content_length)
    assert r.status == 413 and body_json(r)["type"].endswith("/request-too-large"), r
    if content_length:
        assert stream.tell() == 0, "a Content-Length over the limit must be refused without reading the body"
    else:
        assert stream.tell() == MAX_BODY_BYTES + 1, "a body without length is read only up to the limit"
    r, _ = _big_request(app, account, "big", MAX_BODY_BYTES + 1, content_length)
    assert r.status == 413
    r, _ = _big_request(app, account, "big", MAX_BODY_BYTES, content_length)
    assert r.status == 201, r  # exactly the limit passes; the key was not consumed by the 413s
    assert len(ledger(db, account)) == 1


def test_several_keys_are_400():
    mw = IdempotencyMiddleware(lambda e, s: None, pool=None, scope=lambda e: "s")
    for header in ("k1,k2", "k1, k2", '"k1", "k2"'):
        r = request(mw, "POST", "/", b"{}", {"Idempotency-Key": header})
        assert r.status == 400 and body_json(r)["type"].endswith("/idempotency-key-invalid"), header
        assert "several" in body_json(r)["detail"]


@needs_db
def test_a_short_body_is_not_executed(pool, db, account):
    """A server that hands over fewer bytes than the Content-Length (the client hung up): nothing claimed."""
    from payments_service import PaymentsApp
    from wsgiref.util import setup_testing_defaults
    from idempotency_pg import run_wsgi
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/payments", "CONTENT_LENGTH": "600",
               "wsgi.input": io.BytesIO(b'{"amount_cents":100,"currency":"EUR"}'),
               "HTTP_AUTHORIZATION": "Bearer " + account, "HTTP_IDEMPOTENCY_KEY": "short"}
    setup_testing_defaults(environ)
    r = run_wsgi(PaymentsApp(pool), environ)
    assert r.status == 400 and body_json(r)["type"].endswith("/request-body-incomplete"), r
    assert ledger(db, account) == [] and stored_outcome(db, account, "short") == "claimed"
