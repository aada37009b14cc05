"""CONTRACT.md "any-body", on every sample service over a real socket: the middleware never parses the body, passes
its bytes and Content-Type to the claim, and hands it to the handler as the framework would: a form or multipart
payment is read by the framework's own parser (WSGI: python-multipart on ``wsgi.input``; FastAPI:
``request.form()``; Django: ``request.POST``), ``POST /documents`` stores any body; the same bytes replay, other
bytes or another content type are 422, a body the handler cannot read is a not-executed 400 (the key released)."""

import hashlib
import http.client
import json
import uuid

import pytest

from conftest import needs_db
from test_integration import ledger, stored_outcome
from test_wire import SERVICES

pytestmark = needs_db

BOUNDARY = "py41boundary"
FORM = ("application/x-www-form-urlencoded", b"amount_cents=700&currency=EUR")
MULTIPART = ("multipart/form-data; boundary=" + BOUNDARY, (
    "--{b}\r\nContent-Disposition: form-data; name=\"amount_cents\"\r\n\r\n700\r\n"
    "--{b}\r\nContent-Disposition: form-data; name=\"currency\"\r\n\r\nEUR\r\n--{b}--\r\n").format(b=BOUNDARY).encode())


@pytest.fixture(scope="module", params=list(SERVICES))
def service(request, start_service):
    return start_service(SERVICES[request.param])


def post(port, path, account, key, content_type, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": "Bearer " + account, "Idempotency-Key": key}
    if content_type is not None:
        headers["Content-Type"] = content_type
    c.request("POST", path, body=body, headers=headers)
    r = c.getresponse()
    out = (r.status, r.getheader("Content-Type"), r.getheader("Idempotent-Replayed"), r.read())
    c.close()
    return out


@pytest.mark.parametrize("form", [FORM, MULTIPART], ids=["form", "multipart"])
def test_a_form_payment_is_read_by_the_frameworks_parser_and_replays(service, db, account, form):
    first = post(service, "/payments", account, "k", *form)
    assert first[:3] == (201, "application/json", None), first
    assert json.loads(first[3])["amount_cents"] == 700
    again = post(service, "/payments", account, "k", *form)
    assert again == (201, "application/json", "true", first[3])
    # other bytes, or the same bytes as another content type: another request
    assert post(service, "/payments", account, "k", form[0], form[1].replace(b"700", b"701"))[0] == 422
    assert post(service, "/payments", account, "k", "text/plain", form[1])[0] == 422
    assert [(r[1], r[2]) for r in ledger(db, account)] == [(-700, "EUR")]


@pytest.mark.parametrize("amount", [b"1e2", b"1.0", b"0", b"-5", b"01", b""])
def test_a_form_amount_must_be_the_integer_literal_json_allows(service, db, account, amount):
    r = post(service, "/payments", account, "k", FORM[0], b"amount_cents=" + amount + b"&currency=EUR")
    assert (r[0], json.loads(r[3])["type"].rsplit("/", 1)[1]) == (422, "invalid-payment"), r
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


def test_a_body_the_payment_handler_cannot_read_is_a_not_executed_400(service, db, account):
    r = post(service, "/payments", account, "k", "text/plain", b"not json")
    assert (r[0], json.loads(r[3])["type"].rsplit("/", 1)[1]) == (400, "request-body-not-json"), r
    assert stored_outcome(db, account, "k") == "claimed"  # the key released: the proper retry runs
    ok = post(service, "/payments", account, "k", "text/plain", b'{"amount_cents":5,"currency":"EUR"}')
    assert ok[0] == 201, ok


@pytest.mark.parametrize("content_type,body", [
    ("text/plain; charset=utf-8", "caf\u00e9\n".encode()),
    ("application/octet-stream", bytes(range(256))),
    (None, b""),
    ("application/json", b'{"a": [1, 2]}'),
    FORM, MULTIPART,
], ids=["text", "binary", "empty", "json", "form", "multipart"])
def test_documents_stores_any_body_and_replays_it(service, db, account, content_type, body):
    first = post(service, "/documents", account, "d", content_type, body)
    assert first[:3] == (201, "application/json", None), first
    doc = json.loads(first[3])
    assert doc == {"document_id": doc["document_id"], "content_type": content_type, "bytes": len(body),
                   "sha256": hashlib.sha256(body).hexdigest()}
    assert post(service, "/documents", account, "d", content_type, body) == (201, "application/json", "true",
                                                                             first[3])
    other = b"[]" if content_type in (None, "application/json") else body + b"x"  # still JSON where it must be
    assert post(service, "/documents", account, "d", content_type, other)[0] == 422
    assert post(service, "/documents", account, "d", "application/x-other", body)[0] == 422
    rows = db.execute("SELECT content_type, body FROM documents WHERE account = %s", (account,)).fetchall()
    assert rows == [(content_type, body)]


def test_a_json_body_keeps_its_1_2_fingerprint(service, db, account):
    """A JSON body is fingerprinted as 1.2 did (key order and white space do not matter), with or without the
    Content-Type."""
    key = uuid.uuid4().hex
    first = post(service, "/payments", account, key, "application/json", b'{"amount_cents":9,"currency":"EUR"}')
    again = post(service, "/payments", account, key, None, b'{ "currency": "EUR", "amount_cents": 9 }')
    assert (first[0], again[0], again[2], again[3]) == (201, 201, "true", first[3])
