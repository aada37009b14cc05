"""The middleware's answers that come before any database work (the pool must not be touched)."""

import pytest

from idempotency_pg import HTTPProblem, IdempotencyMiddleware
from payments_service import PaymentsApp, account_scope

from wsgi_client import body_json, request


class NoPool:
    def connection(self):
        raise AssertionError("the pool must not be used")


def never_called(environ, start_response):
    raise AssertionError("the handler must not run")


@pytest.fixture
def app():
    return PaymentsApp(NoPool(), faults=True)


GOOD = {"amount_cents": 100, "currency": "EUR"}
AUTH = {"Authorization": "Bearer acct_1"}


@pytest.mark.parametrize("key", [None, "", '""', '"abc', "a b", "x" * 256, "a\x01b"])
def test_missing_or_invalid_key_is_400(app, key):
    r = request(app, "POST", "/payments", GOOD, AUTH if key is None else dict(AUTH, **{"Idempotency-Key": key}))
    assert (r.status, r.header("Content-Type")) == (400, "application/problem+json")
    assert body_json(r)["type"].endswith("/idempotency-key-" + ("missing" if key is None else "invalid"))


@pytest.mark.parametrize("body", [b"", b"not json", b"{", b'{"amount_cents": NaN}', b"\xff"])
def test_the_middleware_never_parses_the_body(body):
    """CONTRACT.md "any-body": any body goes on to the claim (here a pool that refuses), never answered 400 by the
    middleware itself."""
    mw = IdempotencyMiddleware(never_called, NoPool(), scope=account_scope)
    r = request(mw, "POST", "/payments", body, dict(AUTH, **{"Idempotency-Key": "k"}))
    assert r.status == 500  # the pool was asked for a connection: the claim was reached


@pytest.mark.parametrize("auth", [None, "", "Bearer", "Bearer ", "Basic abc", "Bearer UPPER", "Bearer a-b",
                                  "Bearer " + "a" * 65, "Bearer a b"])
def test_bad_authorization_is_401(app, auth):
    headers = {"Idempotency-Key": "k"}
    if auth is not None:
        headers["Authorization"] = auth
    r = request(app, "POST", "/payments", GOOD, headers)
    assert r.status == 401
    assert body_json(r)["status"] == 401
    assert r.header("WWW-Authenticate") == "Bearer"


def test_account_scope():
    assert account_scope({"HTTP_AUTHORIZATION": "Bearer acct_9"}) == "acct_9"
    assert account_scope({"HTTP_AUTHORIZATION": "bearer   acct_9 "}) == "acct_9"
    with pytest.raises(HTTPProblem):
        account_scope({})


def test_healthz_and_routes(app):
    r = request(app, "GET", "/healthz")
    assert (r.status, body_json(r)) == (200, {"ok": True})
    assert request(app, "GET", "/payments").status == 405
    assert request(app, "GET", "/nowhere").status == 404


def test_other_methods_pass_through():
    seen = []

    def inner(environ, start_response):
        seen.append(environ["REQUEST_METHOD"])
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    mw = IdempotencyMiddleware(inner, NoPool(), methods=("POST",))
    r = request(mw, "GET", "/x")
    assert (r.status, r.body, seen) == (200, b"ok", ["GET"])
    assert request(mw, "POST", "/x", {}).status == 400  # no key: refused before the pool


def test_asgi_read_body_takes_only_a_whole_body():
    """A disconnect is not the end of the body; a Content-Length over the limit is refused before any receive."""
    import asyncio

    from idempotency_pg import BodyIncomplete, BodyTooLarge
    from idempotency_pg.asgi import read_body

    def read(messages, length=None):
        got = []

        async def receive():
            got.append(messages[len(got)])
            return got[-1]
        headers = [(b"content-length", str(length).encode())] if length is not None else []
        try:
            return asyncio.run(read_body({"headers": headers}, receive, 100)), len(got)
        except (BodyIncomplete, BodyTooLarge) as e:
            return type(e).__name__, len(got)

    part = {"type": "http.request", "body": b"{}", "more_body": True}
    assert read([part, {"type": "http.disconnect"}]) == ("BodyIncomplete", 2)
    assert read([dict(part, more_body=False)], length=60) == ("BodyIncomplete", 1)
    assert read([part], length=101) == ("BodyTooLarge", 0)
    assert read([dict(part, body=b" " * 60)] * 2) == ("BodyTooLarge", 2)  # no length: cut off at the limit
    assert read([part, dict(part, more_body=False)], length=4) == (b"{}{}", 2)
