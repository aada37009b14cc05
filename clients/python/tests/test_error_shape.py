"""CONTRACT.md "error-shape", "expired" and "store-less": the answers the middleware writes go through one hook
(``render_problem``, default problem+json; Stripe's shape shown here), ``expired`` is a 410, and a route's
``redact`` / ``store_body`` options keep what they drop out of the stored row (read from idempotency_keys)."""

import json

import pytest

from idempotency_pg import IdempotencyMiddleware, Problem, Response, claim_response, json_response, problem_json
from idempotency_pg.lease import run
from idempotency_pg.responses import stored_body

from conftest import needs_db
from wsgi_client import request

AUTH = {"Authorization": "Bearer acct_1"}


def stripe_error(p):
    """Stripe's shape: ``{"error": {"type": "idempotency_error", "message": ...}}``, ``Stripe-Should-Retry``."""
    retry = "true" if p.status == 409 else "false"
    return json_response(p.status, {"error": {"type": "idempotency_error", "message": p.detail}},
                         list(p.headers) + [("Stripe-Should-Retry", retry)])


class NoPool:
    def connection(self):
        raise RuntimeError("no database here")


def never_called(environ, start_response):
    raise AssertionError("the handler must not run")


def stripe_body(r):
    assert r.header("Content-Type") == "application/json"
    body = json.loads(r.body)
    assert set(body) == {"error"} and body["error"]["type"] == "idempotency_error" and body["error"]["message"]
    return body


@pytest.mark.parametrize("outcome,status,retry", [("mismatch", 422, "false"), ("in_progress", 409, "true"),
                                                  ("expired", 410, "false")])
def test_claim_outcomes_in_stripes_shape(outcome, status, retry):
    r = claim_response(outcome, {"mismatch": 422, "in_progress": 409, "expired": 410}[outcome], None, None,
                       render_problem=stripe_error)
    assert (r.status, r.header("Stripe-Should-Retry")) == (status, retry)
    stripe_body(r)
    assert r.header("Retry-After") == ("1" if status == 409 else None)


def test_expired_is_410_problem_by_default():
    r = claim_response("expired", 410, None, None)
    body = json.loads(r.body)
    assert (r.status, r.header("Content-Type")) == (410, "application/problem+json")
    assert body["type"].endswith("/idempotency-key-expired") and body["status"] == 410


@pytest.mark.parametrize("headers,body,status", [
    ({}, b"{}", 400),  # key missing
    ({"Idempotency-Key": "a, b"}, b"{}", 400),  # several keys
    ({"Idempotency-Key": "k", "Content-Length": str(2 * 1024 * 1024)}, b"", 413),
    ({"Idempotency-Key": "k"}, b"{}", 500),  # the pool fails: internal error
])
def test_the_middlewares_own_answers_go_through_the_hook(headers, body, status):
    mw = IdempotencyMiddleware(never_called, NoPool(), scope=lambda e: "acct_1", render_problem=stripe_error)
    env_headers = dict(AUTH, **{k: v for k, v in headers.items() if k != "Content-Length"})
    from wsgi_client import environ_of
    from idempotency_pg import run_wsgi
    env = environ_of("POST", "/payments", body, env_headers)
    if "Content-Length" in headers:
        env["CONTENT_LENGTH"] = headers["Content-Length"]
    r = run_wsgi(mw, env)
    assert (r.status, r.header("Stripe-Should-Retry")) == (status, "false")
    stripe_body(r)


def test_the_default_is_problem_json():
    mw = IdempotencyMiddleware(never_called, NoPool(), scope=lambda e: "acct_1")
    r = request(mw, "POST", "/payments", b"{}", AUTH)
    assert (r.status, r.header("Content-Type")) == (400, "application/problem+json")
    assert r.body == problem_json(Problem(400, "idempotency-key-missing", "Idempotency-Key required",
                                          json.loads(r.body)["detail"])).body


def test_stored_body_redacts_json_pointers():
    body = b'{"id": 1, "api_key": "sk_1", "card": {"number": "4242", "last4": "4242"}, "a/b": 1, "m~n": 2}'
    out, headers = stored_body(body, {}, ["/api_key", "/nope", "/card/number", "/a~1b", "/m~0n"])
    assert json.loads(out) == {"id": 1, "card": {"last4": "4242"}}
    assert headers == {"Idempotent-Replay-Redacted": "/api_key, /card/number, /a~1b, /m~0n"}
    assert stored_body(b"[1, 2]", {}, ["/0"]) == (b"[1, 2]", {})  # not an object: as is
    assert stored_body(b"plain", {}, ["/x"]) == (b"plain", {})
    assert stored_body(b'{"x": 1}', {}, ["/y"]) == (b'{"x": 1}', {})  # nothing present: the bytes as sent
    assert stored_body(b'{"x": 1}', {"A": "b"}, (), store_body=False) == (None, {"A": "b",
                                                                              "Idempotent-Replay-Body": "omitted"})
    with pytest.raises(ValueError):
        IdempotencyMiddleware(never_called, NoPool(), redact=["api_key"])


SECRET = {"id": 7, "api_key": "sk_live_secret", "card": {"number": "4242424242424242", "last4": "4242"}}


def secret_app(environ, start_response):
    r = json_response(201, SECRET, [("Location", "/x/7")])
    start_response(r.status_line(), r.wsgi_headers())
    return [r.body]


def stored_row(db, account, key="k"):
    return db.execute("SELECT response_content_type, response_bytes, response_headers::text FROM idempotency_keys "
                      "WHERE key = %s AND scope = %s", (key, account)).fetchone()


@needs_db
def test_redacted_members_are_never_stored(pool, db, account):
    mw = IdempotencyMiddleware(secret_app, pool, scope=lambda e: account, redact=["/api_key", "/card/number"])
    first = request(mw, "POST", "/x", b"{}", {"Idempotency-Key": "k"})
    again = request(mw, "POST", "/x", b"{}", {"Idempotency-Key": "k"})
    assert json.loads(first.body) == SECRET and first.header("Idempotent-Replay-Redacted") is None
    assert json.loads(again.body) == {"id": 7, "card": {"last4": "4242"}}
    assert (again.status, again.header("Idempotent-Replayed")) == (201, "true")
    assert again.header("Idempotent-Replay-Redacted") == "/api_key, /card/number"
    content_type, stored, headers = stored_row(db, account)
    assert content_type == "application/json" and b"sk_live" not in stored and b"42424242" not in stored
    assert "sk_live" not in headers and json.loads(headers)["Idempotent-Replay-Redacted"] == "/api_key, /card/number"


@needs_db
def test_store_body_off_stores_status_and_headers_only(pool, db, account):
    mw = IdempotencyMiddleware(secret_app, pool, scope=lambda e: account, store_body=False)
    first = request(mw, "POST", "/x", b"{}", {"Idempotency-Key": "k"})
    again = request(mw, "POST", "/x", b"{}", {"Idempotency-Key": "k"})
    assert json.loads(first.body) == SECRET
    assert (again.status, again.body, again.header("Location")) == (201, b"", "/x/7")
    assert again.header("Idempotent-Replay-Body") == "omitted" and again.header("Content-Type") is None
    content_type, stored, headers = stored_row(db, account)
    assert (content_type, stored) == (None, None) and "sk_live" not in headers


@needs_db
@pytest.mark.parametrize("options", [{"redact": ["/api_key", "/card/number"]}, {"store_body": False}],
                         ids=["redact", "store-body-off"])
def test_lease_mode_stores_less_too(pool, db, account, options):
    def go():
        return run(pool, key="k", scope=account, method="POST", path="/t", body_text="{}", steps=[],
                   finish=lambda conn, ctx: json_response(201, SECRET), lease_seconds=5.0, **options)
    first, again = go(), go()
    assert json.loads(first.body) == SECRET and again.header("Idempotent-Replayed") == "true"
    _, stored, headers = stored_row(db, account)
    assert stored is None or b"sk_live" not in stored
    assert "sk_live" not in headers and b"sk_live" not in again.body


async def _asgi_post(app, path, key):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")]}
    await app(scope, receive, send)
    headers = {k.decode().lower(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


@needs_db
def test_asgi_store_options_per_route_and_render_problem(database_url, db, account):
    """One ASGI middleware over several routes: ``store_options`` redacts on one route and stores no body on
    another; ``render_problem`` writes the 422 mismatch in Stripe's shape."""
    import asyncio

    from idempotency_pg.asgi import IdempotencyASGIMiddleware, PsycopgBackend, async_connection_pool

    async def app(scope, receive, send):
        r = json_response(201, SECRET)
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(k.encode(), v.encode()) for k, v in r.wsgi_headers()]})
        await send({"type": "http.response.body", "body": r.body})

    routes = {"/redacted": {"redact": ["/api_key"]}, "/bodiless": {"store_body": False}}

    async def main():
        pool = async_connection_pool(database_url, min_size=1, max_size=2)
        await pool.open(wait=True, timeout=30)
        try:
            mw = IdempotencyASGIMiddleware(app, PsycopgBackend(pool), scope=lambda s: account,
                                           store_options=lambda s, path: routes.get(path),
                                           render_problem=stripe_error)
            out = {}
            for path in ("/redacted", "/bodiless", "/whole"):
                out[path] = [await _asgi_post(mw, path, path) for _ in range(2)]
            out["mismatch"] = await _asgi_post(mw, "/whole", "/redacted")
            return out
        finally:
            await pool.close()
    out = asyncio.run(main())
    (s1, _, b1), (s2, h2, b2) = out["/redacted"]
    assert (s1, json.loads(b1), s2, json.loads(b2)) == (201, SECRET, 201, {k: v for k, v in SECRET.items()
                                                                           if k != "api_key"})
    assert h2["idempotent-replay-redacted"] == "/api_key"
    (_, _, b1), (s2, h2, b2) = out["/bodiless"]
    assert (json.loads(b1), s2, b2, h2["idempotent-replay-body"]) == (SECRET, 201, b"", "omitted")
    (_, _, b1), (_, h2, b2) = out["/whole"]
    assert b1 == b2 and h2["idempotent-replayed"] == "true" and "idempotent-replay-redacted" not in h2
    status, headers, body = out["mismatch"]
    assert (status, headers["stripe-should-retry"], json.loads(body)["error"]["type"]) == (422, "false",
                                                                                            "idempotency_error")
    assert b"sk_live" not in stored_row(db, account, "/redacted")[1]


@needs_db
def test_django_decorator_options(django_configured, db, account):
    """``@idempotent(redact=..., render_problem=...)``: the stored row lacks the member, the 400 is Stripe's."""
    from django.core.handlers.wsgi import WSGIRequest
    from django.http import HttpResponse

    from idempotency_pg.django import idempotent
    from wsgi_client import environ_of

    @idempotent(scope=lambda request: account, redact=["/card/number"], render_problem=stripe_error)
    def view(request):
        return HttpResponse(json.dumps(SECRET), status=201, content_type="application/json")

    first = view(WSGIRequest(environ_of("POST", "/d", b"{}", {"Idempotency-Key": "k"})))
    again = view(WSGIRequest(environ_of("POST", "/d", b"{}", {"Idempotency-Key": "k"})))
    missing = view(WSGIRequest(environ_of("POST", "/d", b"{}", {})))
    assert json.loads(first.content) == SECRET and json.loads(again.content)["card"] == {"last4": "4242"}
    assert again["Idempotent-Replay-Redacted"] == "/card/number"
    assert (missing.status_code, missing["Stripe-Should-Retry"]) == (400, "false")
    assert b"4242424242424242" not in stored_row(db, account)[1]
