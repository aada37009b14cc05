"""Helpers for the tests: a minimal in-process WSGI client, and a pool of one connection."""

import io
import json
from wsgiref.util import setup_testing_defaults

from idempotency_pg import run_wsgi


def request(app, method, path, body=b"", headers=None):
    return run_wsgi(app, environ_of(method, path, body, headers))


def environ_of(method, path, body=b"", headers=None):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(body),
               "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json"}
    for name, value in (headers or {}).items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    setup_testing_defaults(environ)
    return environ


def body_json(response):
    return json.loads(response.body)


class OneConnection:
    """A pool of one connection, sync or async (to trace it, or to check what is left open on it)."""

    def __init__(self, conn):
        self.conn = conn

    def connection(self):
        return self

    def __enter__(self):
        return self.conn

    def __exit__(self, *exc):
        return None

    async def __aenter__(self):
        return self.conn

    async def __aexit__(self, *exc):
        return None
