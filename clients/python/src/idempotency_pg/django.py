"""Django integration: the claim inside ``transaction.atomic()`` on Django's own connection.

::

    from idempotency_pg.django import idempotent

    @idempotent(scope=lambda request: str(request.user.pk))
    def create_payment(request):
        payment = Payment.objects.create(...)          # the ORM write joins the claim's transaction
        return JsonResponse({...}, status=201)

Per request: scope (may raise :class:`HTTPProblem`, e.g. a 401), key (400 missing, invalid or several), body
(413 over ``max_body_bytes``, 400 if not JSON), then ``with transaction.atomic(using=...)``: ``idem_claim`` on
``connections[using]``, the view, ``idem_complete`` with the response the view produced, and the atomic block's
COMMIT.  An exception in the view becomes the response Django itself would send for it
(``response_for_exception``: 404 for ``Http404``, 403, 400, 500): a 4xx is stored and committed as sent, a 5xx
rolls back.  ``raise NotExecuted(response)`` (or ``request.idempotency.not_executed = True``) answers without
storing anything.  The response is sent in its stored form, so replays are the same bytes.  40001/40P01: the
whole block runs again (``max_retries``).  Streaming responses cannot be stored: they roll back with a 500.

Round trips: psycopg2 (Django 3.2's driver) sends BEGIN on its own and ``atomic()`` sends COMMIT, so the claim
and the completion are one statement each (5 with the view's INSERT, where the psycopg middleware sends 3).
"""

import functools
import logging
from contextlib import contextmanager

from . import core
from .header import parse_idempotency_key
from .responses import (MAX_BODY_BYTES, PROBLEM_BASE, BodyTooLarge, HTTPProblem, NotExecuted, Response,
                        claim_response, problem, sent_form, stored_form_of)

log = logging.getLogger("idempotency_pg")

BAD_BODY_STATES = ("22P02", "22P05", "22003")


class RequestContext:
    """``request.idempotency`` inside the view."""

    def __init__(self, key, scope, attempt):
        self.key, self.scope, self.attempt = key, scope, attempt
        self.not_executed = False


def _sqlstate(exc):
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return getattr(cause, "pgcode", None) or getattr(exc, "pgcode", None)


def to_django(response):
    from django.http import HttpResponse

    r = HttpResponse(response.body, status=response.status)
    for k, v in response.headers:
        if k.lower() != "content-length":
            r[k] = v
    r["Content-Length"] = str(len(response.body))  # else the server answers chunked and closes the connection
    return r


def from_django(dresp):
    headers = [(k, v) for k, v in dresp.items()]
    return Response(dresp.status_code, headers, dresp.content)


def idempotent(scope=None, *, using="default", methods=("POST", "PUT", "PATCH", "DELETE"), ttl=None,
               max_retries=3, replay_headers=None, problem_base=PROBLEM_BASE, max_body_bytes=MAX_BODY_BYTES):
    """Decorate a Django view so that each request with an ``Idempotency-Key`` runs at most once."""
    opts = core.Options(scope=scope, methods=methods, ttl=ttl, max_retries=max_retries,
                        replay_headers=replay_headers, problem_base=problem_base, max_body_bytes=max_body_bytes)

    def decorator(view):
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            if request.method.upper() not in opts.methods:
                return view(request, *args, **kwargs)
            return _handle(request, view, args, kwargs)

        def _handle(request, view, args, kwargs):
            from django.db import OperationalError

            try:
                tenant = opts.scope(request)
                key = parse_idempotency_key(request.META.get("HTTP_IDEMPOTENCY_KEY"))
                params = opts.claim_params(key, request.method.upper(), request.path, _body(request), tenant)
            except core.REFUSED as e:
                return to_django(opts.refused(e))
            for attempt in range(opts.max_retries + 1):
                try:
                    return _attempt(request, view, args, kwargs, params, attempt)
                except core.BadBody as e:
                    return to_django(opts.refused(e))
                except OperationalError as e:
                    if _sqlstate(e) not in ("40001", "40P01"):
                        return _failed(e)
                    log.info("idempotency: %s on attempt %d, retrying", _sqlstate(e), attempt + 1)
                except Exception as e:  # noqa: BLE001 - a database error outside the view
                    return _failed(e)
            return to_django(opts.conflict())

        def _body(request):
            """The body, refused (:class:`BodyTooLarge`) over the limit: by its ``Content-Length`` before Django
            reads it, else by its length."""
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > opts.max_body_bytes:
                raise BodyTooLarge(length)
            raw = request.body
            if len(raw) > opts.max_body_bytes:
                raise BodyTooLarge(len(raw))
            return raw

        def _failed(e):
            log.exception("idempotency: request failed")
            return to_django(opts.failed(_sqlstate(e)))

        def _attempt(request, view, args, kwargs, params, attempt):
            from django.core.handlers.exception import response_for_exception
            from django.db import DatabaseError, connections, transaction

            with transaction.atomic(using=using):
                with connections[using].cursor() as cur:
                    try:
                        cur.execute(core.CLAIM_SELECT, params)
                    except DatabaseError as e:
                        if _sqlstate(e) in BAD_BODY_STATES:
                            raise core.BadBody() from e
                        raise
                    row = cur.fetchone()
                early = claim_response(*row, base=opts.problem_base)
                if early is not None:
                    transaction.set_rollback(True, using=using)
                    return to_django(early)
                ctx = RequestContext(params["key"], params["scope"], attempt)
                request.idempotency = ctx
                try:
                    dresp = view(request, *args, **kwargs)
                except NotExecuted as ne:
                    transaction.set_rollback(True, using=using)
                    return to_django(ne.response)
                except HTTPProblem as hp:
                    dresp = to_django(hp.response)
                except DatabaseError:
                    raise  # the statement failed: the block rolls back, the caller answers 500 (or retries)
                except Exception as exc:  # noqa: BLE001 - answered as Django would, at its own boundary
                    dresp = response_for_exception(request, exc)
                if getattr(dresp, "streaming", False):
                    transaction.set_rollback(True, using=using)
                    return to_django(problem(500, "internal-error", "Internal Server Error",
                                             "a streaming response cannot be stored", (), opts.problem_base))
                if ctx.not_executed or 500 <= dresp.status_code <= 599:
                    transaction.set_rollback(True, using=using)
                    return dresp
                response = from_django(dresp)
                stored = stored_form_of(response, opts.replay_headers)
                with connections[using].cursor() as cur:
                    cur.execute(core.COMPLETE_SELECT, core.complete_params(params, response.status, stored))
                    stored.read_back = cur.fetchone()[1]
            # committed
            final = sent_form(response, stored)
            if final is response:
                return dresp
            out = to_django(final)
            for c in dresp.cookies.values():
                out.cookies[c.key] = c
            return out

        return wrapper

    return decorator


# --------------------------------------------------------------------------- lease mode

def lease_pool(using="default"):
    """Django's own connection as the pool of :func:`idempotency_pg.lease.run`, so that a step's ``commit`` and
    the ``finish`` run in ``transaction.atomic(using=using)`` and may write with the ORM::

        from idempotency_pg.django import lease_pool
        from idempotency_pg.lease import Step, run

        response = to_django(run(lease_pool(), key=..., steps=[...], finish=...))

    ``conn.execute(sql, params)`` (psycopg's call, on Django's cursor) returns the cursor.  Django keeps one
    connection per thread: the heartbeat's thread gets one of its own, closed when the heartbeat ends."""
    return _DjangoLeasePool(using)


class _DjangoLeasePool:
    def __init__(self, using):
        self.using = using

    @contextmanager
    def connection(self):
        from django.db import connections

        yield _DjangoConnection(connections[self.using], self.using)

    def close_thread(self):
        from django.db import connections

        connections[self.using].close()


class _DjangoConnection:
    """The two calls of a psycopg connection that the lease steps use, on a Django connection."""

    def __init__(self, connection, using):
        self.connection, self.using = connection, using

    def execute(self, sql, params=None):
        cur = self.connection.cursor()
        cur.execute(sql, params)
        return cur

    def transaction(self):
        from django.db import transaction

        return transaction.atomic(using=self.using)


__all__ = ["RequestContext", "idempotent", "lease_pool", "to_django", "from_django"]
