"""CONTRACT.md "key-lifetime" (1.4): the server writes the key's expiry, ``Idempotency-Key-Expires``, into the
claim's headers; the middleware adds it to a stored first answer (never to the stored row), a replay carries the
server's, and 422 / 409 carry it through the ``render_problem`` hook's headers.  Lease mode the same."""

import json
import re
from email.utils import parsedate_to_datetime

import pytest

from idempotency_pg import IdempotencyMiddleware, claim_response, json_response
from idempotency_pg.lease import run
from idempotency_pg.responses import answer_headers

from conftest import needs_db
from wsgi_client import request

DATE = "Tue, 08 Dec 2026 10:30:00 GMT"
DATED = json.dumps({"Idempotency-Key-Expires": DATE})
IMF_FIXDATE = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
                         r"\d{4} \d\d:\d\d:\d\d GMT$")


def test_answer_headers_from_the_claim():
    assert answer_headers("claimed", DATED) == [("Idempotency-Key-Expires", DATE)]
    assert answer_headers("claimed", None) == []  # a 1.3 server
    assert answer_headers("replay", DATED) == []  # a replay's come with its stored headers
    # string values only, none that could split the header block
    assert answer_headers("claimed", json.dumps({"A": "x\r\nB: y", "N": 1, "Idempotency-Key-Expires": DATE})) == [
        ("Idempotency-Key-Expires", DATE)]
    assert answer_headers("claimed", "[1]") == [] and answer_headers("claimed", "not json") == []


def test_mismatch_and_in_progress_carry_it_through_the_hook():
    seen = []

    def hook(p):
        seen.append(list(p.headers))
        return json_response(p.status, {"error": p.type}, p.headers)
    r = claim_response("mismatch", 422, None, DATED, render_problem=hook)
    assert (r.status, r.header("Idempotency-Key-Expires")) == (422, DATE)
    r = claim_response("in_progress", 409, None, DATED, render_problem=hook)
    assert (r.header("Retry-After"), r.header("Idempotency-Key-Expires")) == ("1", DATE)
    assert seen == [[("Idempotency-Key-Expires", DATE)], [("Retry-After", "1"), ("Idempotency-Key-Expires", DATE)]]
    # the default problem+json too; without a known expiry, Retry-After alone
    assert claim_response("mismatch", 422, None, DATED).header("Idempotency-Key-Expires") == DATE
    assert claim_response("in_progress", 409, None, None).headers == [
        ("Content-Type", "application/problem+json"), ("Retry-After", "1")]
    assert claim_response("expired", 410, None, None).header("Idempotency-Key-Expires") is None


def created(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    r = json_response(503 if b"fail" in body else 201, {"ok": True}, [("Location", "/x/1")])
    start_response(r.status_line(), r.wsgi_headers())
    return [r.body]


def stored_headers(db, account, key):
    return db.execute("SELECT response_headers::text, expires_at FROM idempotency_keys WHERE key = %s AND scope = %s",
                      (key, account)).fetchone()


@needs_db
def test_first_answer_and_replay_say_the_same_date_never_stored(pool, db, account):
    mw = IdempotencyMiddleware(created, pool, scope=lambda e: account)
    first = request(mw, "POST", "/x", b'{"a": 1}', {"Idempotency-Key": "k"})
    again = request(mw, "POST", "/x", b'{"a": 1}', {"Idempotency-Key": "k"})
    other = request(mw, "POST", "/x", b'{"a": 2}', {"Idempotency-Key": "k"})
    date = first.header("Idempotency-Key-Expires")
    assert first.status == 201 and date and IMF_FIXDATE.match(date)
    assert (again.status, again.header("Idempotent-Replayed"), again.header("Idempotency-Key-Expires")) == (
        201, "true", date)
    assert (other.status, other.header("Idempotency-Key-Expires")) == (422, date)
    headers, expires_at = stored_headers(db, account, "k")
    assert "Idempotency-Key-Expires" not in headers and json.loads(headers) == {"Location": "/x/1"}
    assert parsedate_to_datetime(date) == expires_at.replace(microsecond=0)  # the row's expiry, to the second
    # a 5xx is not stored: no expiry on it
    failed = request(mw, "POST", "/x", b'{"fail": 1}', {"Idempotency-Key": "k5"})
    assert (failed.status, failed.header("Idempotency-Key-Expires")) == (503, None)


@needs_db
def test_lease_mode_first_answer_and_replay(pool, db, account):
    def go():
        return run(pool, key="lk", scope=account, method="POST", path="/t", body_text="{}", steps=[],
                   finish=lambda conn, ctx: json_response(201, {"ok": True}), lease_seconds=5.0)
    first, again = go(), go()
    date = first.header("Idempotency-Key-Expires")
    assert date and IMF_FIXDATE.match(date)
    # a heartbeat may move a lease's expiry later, never earlier (CONTRACT.md)
    assert again.header("Idempotent-Replayed") == "true"
    assert parsedate_to_datetime(again.header("Idempotency-Key-Expires")) >= parsedate_to_datetime(date)
    headers, _ = stored_headers(db, account, "lk")
    assert headers is None or "Idempotency-Key-Expires" not in headers
