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

from idempotency_pg import NotExecuted, Response, json_response, problem
from idempotency_pg.core import drive
from idempotency_pg.django import idempotent, lease_pool, read_body, to_django

from .payment import DOCUMENT_SQL, account_from_authorization, after_write, created, document_created, is_form, \
    json_payment, not_allowed, not_found as _not_found, not_json, payment_from_bytes, serve, validate_payment
from .rides import handle_ride, ride_request


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

def account_scope(request):
    return account_from_authorization(request.META.get("HTTP_AUTHORIZATION", ""))


def _fault(request):
    from django.conf import settings
    return (request.META.get("HTTP_X_FAULT", "").strip() or None) if settings.PAYMENTS_FAULTS else None


def payment_of(request):
    """``(amount, currency)`` of the request as Django reads it: ``request.POST`` (Django's form and multipart
    parsers) when the Content-Type says a form, else ``request.body`` as JSON (NotExecuted if invalid)."""
    if is_form(request.META.get("CONTENT_TYPE")):
        try:
            fields = {k: request.POST.get(k) for k in request.POST}
        except Exception:  # noqa: BLE001 - a body Django's parser refuses
            raise not_json() from None
        return validate_payment(fields, form=True)
    return validate_payment(json_payment(request.body))


def _pay(request, account, key, payment):
    """The handler: the ORM insert, the faults; inside the caller's transaction."""
    from django.db import connection

    from .djangoledger.models import Ledger

    amount, currency = payment
    row = Ledger.objects.create(account=account, amount_cents=-amount, currency=currency, idempotency_key=key)
    with connection.cursor() as cur:
        early = drive(after_write(_fault(request), cur.execute))
    return to_django(early or created(row.id, account, amount, currency))


def _intake(request, path, need_key=True):
    """The request read as the decorator reads it (account, key, whole body, JSON), or the Response refusing it."""
    return drive(_protected.options.intake(request, "POST", path, request.META.get("HTTP_IDEMPOTENCY_KEY"),
                                           lambda limit: read_body(request, limit), need_key=need_key))


def payments(request):
    if request.method != "POST":
        return to_django(not_allowed())
    return _protected(request)


def unprotected(request):
    from django.db import transaction

    if request.method != "POST":
        return to_django(not_allowed())
    params = _intake(request, "/payments-unprotected", need_key=False)
    if isinstance(params, Response):
        return to_django(params)
    try:
        with transaction.atomic():
            return _pay(request, params["scope"], "", payment_from_bytes(params["content_type"], params["raw"]))
    except NotExecuted as e:
        return to_django(e.response)


def rides(request):
    """POST /rides: lease mode (payments_service.rides) on Django's own connection."""
    if request.method != "POST":
        return to_django(not_allowed())
    ride = drive(ride_request(_protected.options, request, request.META.get("HTTP_IDEMPOTENCY_KEY"),
                              lambda limit: read_body(request, limit), _fault(request)))
    return to_django(ride if isinstance(ride, Response) else handle_ride(lease_pool(), ride))


_warm = threading.Event()


def healthz(request):
    if request.method not in ("GET", "HEAD"):
        return to_django(not_allowed("GET, HEAD"))
    if request.META.get("HTTP_X_WARM_UP") == "1":  # see warm_up(): open this thread's connection
        from django.db import connection
        connection.ensure_connection()
        time.sleep(0.2)  # hold this thread so that the other warm-up requests land on other threads
    elif not _warm.is_set():
        return to_django(problem(503, "starting", "Service Unavailable", "opening database connections"))
    return to_django(json_response(200, {"ok": True}))


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
    return to_django(_not_found(request.path))


def server_error(request):
    return to_django(problem(500, "internal-error", "Internal Server Error", "the request failed and was rolled back"))


_protected = idempotent(scope=account_scope, methods=("POST",))(
    lambda request: _pay(request, request.idempotency.scope, request.idempotency.key, payment_of(request)))


def _document(request):
    """POST /documents (CONTRACT.md "any-body"): the body, of any type, stored as it came."""
    from django.db import connection

    content_type, raw = request.META.get("CONTENT_TYPE") or None, request.body
    with connection.cursor() as cur:
        cur.execute(DOCUMENT_SQL, (request.idempotency.scope, request.idempotency.key, content_type, raw))
        (document_id,) = cur.fetchone()
    return to_django(document_created(document_id, content_type, raw))


_protected_documents = idempotent(scope=account_scope, methods=("POST",))(_document)


def documents(request):
    if request.method != "POST":
        return to_django(not_allowed())
    return _protected_documents(request)


def _urlpatterns():
    from django.urls import path, re_path
    return [path("payments", payments), path("documents", documents), path("payments-unprotected", unprotected),
            path("rides", rides),
            path("healthz", healthz),
            re_path(r"^files/.", payments)]  # CONTRACT.md "raw-target": /payments at another path


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
