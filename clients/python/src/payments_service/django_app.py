"""The payment service of clients/CONTRACT.md on Django 3.2 (WSGI, Django's own connection and ORM), with
:func:`idempotency_pg.django.idempotent`, and ``POST /rides`` (lease mode, :mod:`payments_service.rides`) on
Django's own connection (:func:`idempotency_pg.django.lease_pool`).  ``python -m payments_service.django_app``
serves it with waitress on 127.0.0.1:$PORT against $DATABASE_URL (same environment as ``python -m
payments_service``; ``THREADS``, default 10, is also the number of database connections: Django keeps one per
thread)."""

import os
import sys
import threading
import time
from urllib.parse import unquote, urlsplit

from .app import SLEEP_RE, account_from_authorization, validate_payment


def database_settings(url):
    u = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(u.path.lstrip("/")),
        "USER": unquote(u.username or ""),
        "PASSWORD": unquote(u.password or ""),
        "HOST": u.hostname or "",
        "PORT": str(u.port or ""),
        "CONN_MAX_AGE": None,  # one persistent connection per thread: no reconnect after an idle spell
        "DISABLE_SERVER_SIDE_CURSORS": True,  # PgBouncer transaction pooling
    }


def configure(url, faults=False):
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=False, ALLOWED_HOSTS=["127.0.0.1", "localhost"], ROOT_URLCONF="payments_service.django_app",
            MIDDLEWARE=[],
            INSTALLED_APPS=["payments_service.djangoledger"], DATABASES={"default": database_settings(url)},
            USE_TZ=True, SECRET_KEY="payments-service-sample", PAYMENTS_FAULTS=faults,
            DATA_UPLOAD_MAX_MEMORY_SIZE=None,  # the middleware's 1 MiB limit answers 413 instead of Django's 400
        )
        import django
        django.setup()


# --------------------------------------------------------------------------- views

def _problem(status, slug, title, detail="", headers=()):
    from idempotency_pg import problem
    from idempotency_pg.django import to_django
    return to_django(problem(status, slug, title, detail, headers))


def _json(status, obj, headers=()):
    from idempotency_pg import json_response
    from idempotency_pg.django import to_django
    return to_django(json_response(status, obj, headers))


def account_scope(request):
    return account_from_authorization(request.META.get("HTTP_AUTHORIZATION", ""))


def _body(request):
    """The request body; :class:`BodyTooLarge` when its ``Content-Length`` is over 1 MiB, before reading it."""
    from idempotency_pg import MAX_BODY_BYTES, BodyTooLarge

    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > MAX_BODY_BYTES:
        raise BodyTooLarge(length)
    return request.body


def _fault(request):
    from django.conf import settings
    return (request.META.get("HTTP_X_FAULT", "").strip() or None) if settings.PAYMENTS_FAULTS else None


def _pay(request, account, key):
    """The handler: validation (not executed), the ORM insert, the faults; inside the caller's transaction."""
    from django.db import connection
    from idempotency_pg import HTTPProblem

    from .djangoledger.models import Ledger

    amount, currency = validate_payment(request.body)
    row = Ledger.objects.create(account=account, amount_cents=-amount, currency=currency, idempotency_key=key)
    fault = _fault(request)
    if fault == "503":
        return _problem(503, "upstream-unavailable", "Service Unavailable", "upstream unavailable")
    if fault in ("throw-422", "throw-502"):  # Django has no HTTP error exception for these: the library's
        status = int(fault[-3:])
        raise HTTPProblem(status, "thrown-%d" % status, "Thrown %d" % status, "the handler raised after its write")
    with connection.cursor() as cur:
        if fault == "db-error":
            cur.execute("SELECT 1/0")
        m = SLEEP_RE.match(fault or "")
        if m:
            cur.execute("SELECT pg_sleep(%s::int / 1000.0)", [int(m.group(1))])
    return _json(201, {"payment_id": row.id, "account": account, "amount_cents": amount, "currency": currency},
                 [("Location", "/payments/%d" % row.id)])


def payments(request):
    if request.method != "POST":
        return _not_allowed()
    return _protected(request)


def _payments_view(request):
    return _pay(request, request.idempotency.scope, request.idempotency.key)


def unprotected(request):
    from django.db import transaction
    from idempotency_pg import MAX_BODY_BYTES, BodyTooLarge, HTTPProblem, NotExecuted
    from idempotency_pg.django import to_django
    from idempotency_pg.responses import body_too_large, parse_json_body

    if request.method != "POST":
        return _not_allowed()
    try:
        account = account_scope(request)
        parse_json_body(_body(request))
    except HTTPProblem as p:
        return to_django(p.response)
    except BodyTooLarge:
        return to_django(body_too_large(MAX_BODY_BYTES))
    except ValueError:
        return _problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON")
    try:
        with transaction.atomic():
            return _pay(request, account, "")
    except NotExecuted as e:
        return to_django(e.response)


def rides(request):
    """POST /rides: lease mode (payments_service.rides) on Django's own connection."""
    from idempotency_pg import parse_idempotency_key
    from idempotency_pg.django import lease_pool, to_django

    from .rides import REFUSED, Ride, handle_ride, refused

    if request.method != "POST":
        return _not_allowed()
    try:
        account = account_scope(request)
        key = parse_idempotency_key(request.META.get("HTTP_IDEMPOTENCY_KEY"))
        ride = Ride(account, key, _body(request), _fault(request))
    except REFUSED as e:
        return to_django(refused(e))
    return to_django(handle_ride(lease_pool(), ride))


def _not_allowed():
    return _problem(405, "method-not-allowed", "Method Not Allowed", "use POST", [("Allow", "POST")])


_warm = threading.Event()


def healthz(request):
    if request.method not in ("GET", "HEAD"):
        return _problem(405, "method-not-allowed", "Method Not Allowed", "use GET", [("Allow", "GET, HEAD")])
    if request.META.get("HTTP_X_WARM_UP") == "1":  # see warm_up(): open this thread's connection
        from django.db import connection
        connection.ensure_connection()
        time.sleep(0.2)  # hold this thread so that the other warm-up requests land on other threads
    elif not _warm.is_set():
        return _problem(503, "starting", "Service Unavailable", "opening database connections")
    return _json(200, {"ok": True})


def warm_up(port, threads):
    """Django keeps one connection per thread and opens it at the thread's first query: a first click that has
    to connect takes longer than the contract's 409 "at once".  So, once the server listens, one request per
    worker thread opens them all, and /healthz answers 200 only then."""
    import urllib.request

    def one():
        req = urllib.request.Request("http://127.0.0.1:%d/healthz" % port, headers={"X-Warm-Up": "1"})
        for _ in range(100):
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    r.read()
                return
            except OSError:
                time.sleep(0.05)  # not listening yet

    ts = [threading.Thread(target=one) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    _warm.set()


def not_found(request, exception=None):
    return _problem(404, "not-found", "Not Found", "no route for %s" % request.path)


def server_error(request):
    return _problem(500, "internal-error", "Internal Server Error", "the request failed and was rolled back")


def _payments_protected():
    from idempotency_pg.django import idempotent
    return idempotent(scope=account_scope, methods=("POST",))(_payments_view)


_protected = _payments_protected()


def _urlpatterns():
    from django.urls import path
    return [path("payments", payments), path("payments-unprotected", unprotected), path("rides", rides),
            path("healthz", healthz)]


urlpatterns = _urlpatterns()
handler404 = "payments_service.django_app.not_found"
handler500 = "payments_service.django_app.server_error"


def application(url, faults=False):
    """The WSGI app: Django configured for ``url``."""
    configure(url, faults)
    from django.core.wsgi import get_wsgi_application
    return get_wsgi_application()


def main():
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("payments_service.django_app: DATABASE_URL is required", file=sys.stderr)
        return 2
    from .__main__ import serve
    app = application(url, os.environ.get("PAYMENTS_FAULTS") == "1")
    from django.db import connection
    connection.ensure_connection()  # fail before /healthz answers if the database is not there
    connection.close()
    port, threads = int(os.environ.get("PORT", "8080")), int(os.environ.get("THREADS", "10"))
    threading.Thread(target=warm_up, args=(port, threads), daemon=True).start()
    serve(app, port, threads)
    return 0


if __name__ == "__main__":
    # Run the copy of this module that Django's URL conf imports (ROOT_URLCONF), not __main__, so that both
    # share one warm-up flag.
    from payments_service.django_app import main as _main
    sys.exit(_main())
