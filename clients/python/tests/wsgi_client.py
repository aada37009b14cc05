"""A minimal in-process WSGI client for the tests."""

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
