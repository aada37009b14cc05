"""The request target each adapter fingerprints (CONTRACT.md "raw-target"): the path as the request line has it,
undecoded, and the query after the first ``?``, as sent; rebuilt, percent-encoded, only where the server gives no
raw target.  No database: the fingerprint of these parts is the extension's (test_adapters.py checks it)."""

import pytest

from idempotency_pg.core import asgi_target, raw_query, split_target, wsgi_target
from idempotency_pg.django import request_target


def target(pair):
    path, query = pair
    return path, raw_query(query)


@pytest.mark.parametrize("sent,path,query", [
    ("/files/a%2Fb", "/files/a%2Fb", None),
    ("/files/a%2fb", "/files/a%2fb", None),  # the hex digits' case as sent
    ("/files/%41", "/files/%41", None),  # an encoded unreserved character stays encoded
    ("/files/a%20b?", "/files/a%20b", None),  # a trailing ? is no query
    ("/p?q=a%2Fb&r=1?x", "/p", "q=a%2Fb&r=1?x"),  # the query after the first ?, undecoded
    ("?q", "/", "q"),
    ("/caf\xc3\xa9", "/café", None),  # raw UTF-8 in a target (a WSGI native string): its text
])
def test_the_target_as_sent(sent, path, query):
    assert target(split_target(sent)) == (path, query)
    assert target(split_target(sent.encode("latin-1"))) == (path, query)


def wsgi(**environ):
    return dict({"REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/files/a/b", "QUERY_STRING": "x=%2F"},
                **environ)


def test_wsgi_takes_the_raw_target():
    assert target(wsgi_target(wsgi(REQUEST_URI="/files/a%2Fb?x=%2F"))) == ("/files/a%2Fb", "x=%2F")
    # RAW_URI first (gunicorn sets both; Werkzeug's REQUEST_URI is re-quoted)
    assert target(wsgi_target(wsgi(RAW_URI="/files/a%2Fb", REQUEST_URI="/files/a/b"))) == ("/files/a%2Fb", None)


def test_wsgi_without_a_raw_target_encodes_the_decoded_path_again():
    env = wsgi(SCRIPT_NAME="/app", PATH_INFO="/files/caf\xc3\xa9 x/a:b@c")  # PATH_INFO: the bytes as latin-1
    assert target(wsgi_target(env)) == ("/app/files/caf%C3%A9%20x/a:b@c", "x=%2F")
    assert target(wsgi_target(wsgi(PATH_INFO="", QUERY_STRING=""))) == ("/", None)


def asgi(**scope):
    return dict({"type": "http", "method": "POST", "path": "/files/a/b", "root_path": "", "query_string": b"x=%2F"},
                **scope)


def test_asgi_takes_raw_path():
    assert target(asgi_target(asgi(raw_path=b"/files/a%2Fb"))) == ("/files/a%2Fb", "x=%2F")
    # a root_path the server was given is not in what it received
    assert target(asgi_target(asgi(raw_path=b"/files/%41", root_path="/api", query_string=b""))) == ("/files/%41", None)
    assert target(asgi_target(asgi(raw_path=b"/files/a%2Fb?x=%2F"))) == ("/files/a%2Fb", "x=%2F")


def test_asgi_without_raw_path_encodes_the_decoded_path_again():
    assert target(asgi_target(asgi(path="/files/café x", root_path="/api"))) == ("/api/files/caf%C3%A9%20x", "x=%2F")


def test_django_takes_its_servers_target():
    class AsgiRequest:
        scope = asgi(raw_path=b"/files/a%2Fb")
        META = {"PATH_INFO": "/files/a/b"}

    class WsgiRequest:
        META = wsgi(REQUEST_URI="/files/%41?")

    assert target(request_target(AsgiRequest())) == ("/files/a%2Fb", "x=%2F")
    assert target(request_target(WsgiRequest())) == ("/files/%41", None)
