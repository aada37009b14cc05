import base64
import json

import pytest

from idempotency_pg import Response, claim_response, problem, stored_form
from idempotency_pg.responses import PROBLEM_BASE, parse_json_body, replay_response


def as_json(r):
    return json.loads(r.body)


def test_claimed_runs_the_handler():
    assert claim_response("claimed", None, None, None) is None


def test_replay_answers_the_stored_response():
    r = claim_response("replay", 201, '{"payment_id": 7}', '{"Location": "/payments/7", "Content-Type": "application/json"}')
    assert r.status == 201
    assert as_json(r) == {"payment_id": 7}
    assert r.header("Location") == "/payments/7"
    assert r.header("content-type") == "application/json"
    assert r.header("Idempotent-Replayed") == "true"


def test_replay_without_body_or_headers():
    r = claim_response("replay", 204, None, None)
    assert (r.status, r.body) == (204, b"")
    assert r.headers == [("Idempotent-Replayed", "true")]


def test_mismatch_is_422_problem():
    r = claim_response("mismatch", 422, None, None)
    assert r.status == 422
    assert r.header("Content-Type") == "application/problem+json"
    p = as_json(r)
    assert p["type"] == PROBLEM_BASE + "idempotency-key-reused"
    assert p["status"] == 422 and p["title"] and p["detail"]
    assert r.header("Idempotent-Replayed") is None


def test_mismatch_follows_the_configured_status():
    assert claim_response("mismatch", 400, None, None).status == 400


def test_in_progress_is_409_with_retry_after():
    r = claim_response("in_progress", 409, None, None)
    assert r.status == 409
    assert r.header("Retry-After") == "1"
    assert r.header("Content-Type") == "application/problem+json"
    assert as_json(r)["status"] == 409


def test_unknown_outcome():
    with pytest.raises(ValueError):
        claim_response("bogus", 200, None, None)


def test_problem_shape():
    r = problem(400, "idempotency-key-missing", "Idempotency-Key required", "send one")
    assert as_json(r) == {"type": PROBLEM_BASE + "idempotency-key-missing", "title": "Idempotency-Key required",
                          "status": 400, "detail": "send one"}
    assert r.status_line() == "400 Bad Request"


def test_content_length_is_set():
    r = Response(201, [("Content-Length", "999"), ("X", "y")], b"abc")
    assert r.wsgi_headers() == [("X", "y"), ("Content-Length", "3")]


def test_stored_form_keeps_json_and_drops_connection_headers():
    r = Response(201, [("Content-Type", "application/json"), ("Location", "/p/1"), ("Date", "x"),
                       ("Set-Cookie", "a=b"), ("Content-Length", "9")], b'{"id": 1}')
    body, headers = stored_form(r)
    assert json.loads(body) == {"id": 1}
    assert json.loads(headers) == {"Content-Type": "application/json", "Location": "/p/1"}


def test_stored_form_allow_list_and_repeated_headers():
    r = Response(200, [("Content-Type", "application/json"), ("Vary", "A"), ("vary", "B"), ("X-Secret", "s")], b"{}")
    _, headers = stored_form(r, replay_headers=["content-type", "VARY"])
    assert json.loads(headers) == {"Content-Type": "application/json", "Vary": "A, B"}


@pytest.mark.parametrize("content_type,body", [
    ("application/json", b'{"a": [1, 2.50, "x"]}'),
    ("application/problem+json", b'{"status": 422}'),
    ("application/json", b'"just a string"'),
    ("application/json", b"not json after all"),
    ("text/plain; charset=utf-8", b"hello \xc3\xa9"),
    ("text/plain", b'{"looks": "like json"}'),
    ("application/octet-stream", b"\xff\x00\xfe"),
    ("text/plain", b""),
])
def test_stored_form_round_trips(content_type, body):
    r = Response(200, [("Content-Type", content_type)], body)
    body_json, headers_json = stored_form(r)
    # what PostgreSQL gives back: jsonb text of the stored value (spacing may differ, the value may not)
    pg_body = None if body_json is None else json.dumps(json.loads(body_json))
    replay = replay_response(200, pg_body, headers_json)
    if content_type.startswith("application/json") and body.startswith(b"{"):
        assert json.loads(replay.body) == json.loads(body)
    elif content_type.endswith("+json"):
        assert json.loads(replay.body) == json.loads(body)
    elif body == b'"just a string"':
        assert json.loads(replay.body) == "just a string"
    else:
        assert replay.body == body
    assert replay.header("Content-Type") == content_type
    assert replay.header("Idempotency-Body-Encoding") is None


def test_binary_body_is_stored_as_base64():
    body_json, headers_json = stored_form(Response(200, [("Content-Type", "image/png")], b"\x89PNG"))
    assert json.loads(body_json) == base64.b64encode(b"\x89PNG").decode()
    assert json.loads(headers_json)["Idempotency-Body-Encoding"] == "base64"


@pytest.mark.parametrize("raw", [b"", b"nope", b"{", b'{"a": NaN}', b"Infinity", b"\xff{}", b"{'a': 1}"])
def test_request_body_not_json(raw):
    with pytest.raises(ValueError):
        parse_json_body(raw)


@pytest.mark.parametrize("raw", [b"{}", b' { "a" : 1 } ', b"[1,2]", b"null", b'"x"', '{"é": 1}'.encode()])
def test_request_body_json(raw):
    assert parse_json_body(raw) == raw.decode()
