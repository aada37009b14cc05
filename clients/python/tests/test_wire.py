"""Every sample service as a process on a real server (waitress: WSGI and Django; uvicorn: FastAPI on psycopg and on
SQLAlchemy), over a real socket: a body that did not arrive whole is never executed (its retry is, then replayed),
a Content-Length over the limit is answered 413 before the body is sent, and parallel clicks get 409 at once."""

import json
import socket
import threading
import time
import uuid

import pytest

from conftest import needs_db
from test_integration import ledger, stored_outcome

pytestmark = needs_db

SERVICES = {
    "wsgi": ["-m", "payments_service"],
    "fastapi": ["-m", "payments_service.asgi_main", "psycopg"],
    "sqlalchemy": ["-m", "payments_service.asgi_main", "sqlalchemy"],
    "django": ["-m", "payments_service.django_app"],
}
PAYMENT = b'{"amount_cents":100,"currency":"EUR"}'  # 37 bytes: whole JSON on its own


@pytest.fixture(scope="module", params=list(SERVICES))
def service(request, start_service):
    return start_service(SERVICES[request.param])


def exchange(port, head, body=b"", timeout=10.0):
    """Send ``head`` and ``body``, then read the answer until the server closes or ``timeout``; returns
    ``(status, headers, body, seconds)``, status None if nothing came back."""
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head.encode("latin-1") + b"\r\n" + body)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                head_end = data.find(b"\r\n\r\n")
                if head_end >= 0:
                    length = [int(line.split(b":", 1)[1]) for line in data[:head_end].split(b"\r\n")
                              if line.lower().startswith(b"content-length:")]
                    if length and len(data) >= head_end + 4 + length[0]:
                        break
        except socket.timeout:
            pass
    elapsed = time.monotonic() - t
    if not data:
        return None, {}, b"", elapsed
    head_part, _, rest = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest, elapsed


def request_head(account, key, length, path="/payments"):
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {account}\r\n"
            f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n")


def written(db, account, path):
    table = "rides" if path == "/rides" else "ledger"
    return db.execute("SELECT count(*) FROM %s WHERE account = %%s" % table, (account,)).fetchone()[0]


@pytest.mark.parametrize("path", ["/payments", "/rides"])
def test_a_truncated_body_is_not_executed_and_the_key_stays_free(service, db, account, path):
    """Content-Length 600, 37 bytes (a whole JSON payment, the rest would be spaces), then the client is gone."""
    key = "trunc-" + uuid.uuid4().hex[:8]
    with socket.create_connection(("127.0.0.1", service), timeout=10) as s:
        s.sendall(request_head(account, key, 600, path).encode() + b"\r\n" + PAYMENT)
    time.sleep(1.0)  # a server that takes the partial body for the whole executes it within milliseconds
    assert written(db, account, path) == 0, "the truncated request was executed"
    assert stored_outcome(db, account, key) == "claimed", "the key was consumed by the truncated request"
    body = PAYMENT + b" " * (600 - len(PAYMENT))
    status, headers, answer, _ = exchange(service, request_head(account, key, 600, path), body)
    assert status == 201, (status, answer)
    assert "idempotent-replayed" not in headers, "the retry got a replay of a request that never arrived whole"
    assert written(db, account, path) == 1
    status, headers, again, _ = exchange(service, request_head(account, key, 600, path), body)
    assert (status, again, headers.get("idempotent-replayed")) == (201, answer, "true")


def test_a_content_length_over_the_limit_is_413_before_the_body(service, db, account):
    """Headers only: a server that waited for the 10 MiB body would answer nothing before the client's 10 s
    timeout; 413 comes at once (2 s leaves room for two busy cores)."""
    key = "big-" + uuid.uuid4().hex[:8]
    status, headers, answer, elapsed = exchange(service, request_head(account, key, 10 * 1024 * 1024))
    assert status == 413, (status, answer, elapsed)
    assert headers["content-type"] == "application/problem+json"
    assert json.loads(answer)["type"].endswith("/request-too-large")
    assert elapsed < 2.0, "413 after %.1f s" % elapsed
    assert ledger(db, account) == [] and stored_outcome(db, account, key) == "claimed"


def test_a_chunked_body_is_cut_off_at_the_limit(service, db, account):
    """No Content-Length: the body is refused as soon as it passes the limit, with the 413 problem."""
    key = "chunked-" + uuid.uuid4().hex[:8]
    head = request_head(account, key, 0).replace("Content-Length: 0", "Transfer-Encoding: chunked")
    chunk = b" " * 65536
    with socket.create_connection(("127.0.0.1", service), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n" + b"%x\r\n%s\r\n" % (len(PAYMENT), PAYMENT))
        try:
            for _ in range(17):  # 1 MiB + 64 KiB
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server stopped reading: what it answered is below
        data = b""
        while b"\r\n\r\n" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert stored_outcome(db, account, key) == "claimed" and ledger(db, account) == []


def test_five_parallel_clicks_get_409_at_once(service, account):
    """The first click holds the key for 3 s (``X-Fault: sleep=3000``); five more meanwhile each get 409 at once: a
    service waiting for the holder would take 2.7 s or more; 1 s leaves margin on loaded cores (a 409 took over
    200 ms at load average 17)."""
    head = request_head(account, "double-click", len(PAYMENT)) + "X-Fault: sleep=3000\r\n"
    results = {}

    def click(i):
        results[i] = exchange(service, head, PAYMENT)

    first = threading.Thread(target=click, args=(0,))
    first.start()
    time.sleep(0.3)  # the first request holds the key
    others = [threading.Thread(target=click, args=(i,)) for i in range(1, 6)]
    for t in others:
        t.start()
    for t in others:
        t.join()
    assert first.is_alive(), "the first request should still be in flight"
    for i in range(1, 6):
        status, headers, _, elapsed = results[i]
        assert status == 409 and headers["retry-after"] == "1", results[i]
        assert elapsed < 1.0, "click %d took %.0f ms" % (i, elapsed * 1000)
    first.join()
    assert results[0][0] == 201, results[0]
    status, headers, answer, _ = exchange(service, request_head(account, "double-click", len(PAYMENT)), PAYMENT)
    assert (status, answer, headers.get("idempotent-replayed")) == (201, results[0][2], "true")
