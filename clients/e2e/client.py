"""A tiny HTTP client over http.client for the payment services (loopback only), and threads that start at once."""

import http.client
import json
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit


class Response:
    def __init__(self, status, headers, body, elapsed):
        self.status = status
        self.headers = headers  # http.client.HTTPMessage: case-insensitive get()
        self.body = body
        self.elapsed = elapsed

    def header(self, name):
        return self.headers.get(name)

    @property
    def json(self):
        return json.loads(self.body)

    @property
    def content_type(self):
        return (self.header("Content-Type") or "").split(";")[0].strip().lower()

    @property
    def replayed(self):
        return (self.header("Idempotent-Replayed") or "").strip().lower() == "true"

    def __repr__(self):
        return f"<{self.status} {dict(self.headers.items())} {self.body[:300]!r} in {self.elapsed * 1000:.0f} ms>"


def new_key(prefix="k"):
    """A key valid both as an sf-token (starts with a letter) and as an sf-string."""
    return f"{prefix}-{uuid.uuid4().hex}"


def body_of(amount=100, currency="EUR"):
    return json.dumps({"amount_cents": amount, "currency": currency}).encode()


class Client:
    def __init__(self, base, account=None, timeout=15.0):
        u = urlsplit(base)
        assert u.hostname in ("127.0.0.1", "localhost", "::1"), "loopback only"
        self.host, self.port = u.hostname, u.port
        self.account = account
        self.timeout = timeout
        self._conn = None

    def request(self, method, path, body=None, headers=None, keepalive=False):
        hdrs = {"Content-Type": "application/json" if body is not None else None, **(headers or {})}
        hdrs = {k: v for k, v in hdrs.items() if v is not None}  # None: no such header
        conn = self._conn if keepalive else None
        for attempt in (0, 1):
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            t0 = time.monotonic()
            try:
                conn.request(method, path, body=body, headers=hdrs)
                r = conn.getresponse()
                data = r.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                conn = None
                if keepalive and attempt == 0:
                    continue  # a kept-alive connection the server had closed: one fresh try
                raise
            elapsed = time.monotonic() - t0
            if keepalive:
                self._conn = conn
            else:
                conn.close()
            return Response(r.status, r.headers, data, elapsed)

    def pay(self, key=None, amount=100, currency="EUR", fault=None, account=None, body=None, headers=None,
            path="/payments", keepalive=False, auth=True):
        acct = account or self.account
        hdrs = {"Authorization": f"Bearer {acct}" if auth and acct is not None else None, "Idempotency-Key": key,
                "X-Fault": fault, **(headers or {})}  # None: no such header
        body = body_of(amount, currency) if body is None else body
        return self.request("POST", path, body=body, headers=hdrs, keepalive=keepalive)

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def raw_exchange(port, head, body=b"", timeout=20.0, hang_up=False):
    """Send one request (``head``: the request line and header lines, without the blank line) with ``body``, the
    body from a thread of its own, and read the answer meanwhile: a server may answer (e.g. 413) and close before
    the whole body is sent. ``hang_up`` ends the sending side after the body (a client gone mid-body); the server
    may then close, or keep silent until the timeout, without an answer (None). Returns (Response or None, whether the whole body was sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sent = {"all": False}

    def send_body():
        try:
            view = memoryview(body)
            for i in range(0, len(view), 65536):
                s.sendall(view[i:i + 65536])
            sent["all"] = True
            if hang_up:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed first

    try:
        s.sendall(head.encode("latin-1") + b"\r\n")
        t = threading.Thread(target=send_body, daemon=True)
        t0 = time.monotonic()
        t.start()
        r = http.client.HTTPResponse(s, method="POST")
        try:
            r.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError, socket.timeout):
            if not hang_up:
                raise
            return None, sent["all"]
        data = r.read()
        elapsed = time.monotonic() - t0
        t.join(timeout=timeout)
        return Response(r.status, r.headers, data, elapsed), sent["all"]
    finally:
        s.close()


def parallel(n, fn):
    """Runs fn(0) .. fn(n - 1), each in a thread of its own, all released at once (a barrier), and waits for them.
    Returns the exceptions they raised, as repr strings."""
    errors = []
    start = threading.Barrier(n)

    def run(i):
        try:
            start.wait(timeout=30)
            fn(i)
        except Exception as e:  # noqa: BLE001 - returned
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
