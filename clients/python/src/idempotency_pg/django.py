"""Django: a view decorator translating Django's request and response to :meth:`idempotency_pg.core.Options.respond`,
the claim inside ``transaction.atomic()`` on Django's own connection::

    from idempotency_pg.django import idempotent

    @idempotent(scope=lambda request: str(request.user.pk))
    def create_payment(request):
        payment = Payment.objects.create(...)          # the ORM write joins the claim's transaction
        return JsonResponse({...}, status=201)

An exception in the view becomes the response Django itself would send for it (``response_for_exception``: 404
for ``Http404``, 403, 400, 500): a 4xx is stored as sent, a 5xx rolls back; a database error rolls back and is
answered 500 (or runs again after 40001/40P01).  ``raise NotExecuted(response)`` (or
``request.idempotency.not_executed = True``) answers without storing.  Streaming responses cannot be stored: they
roll back with a 500.  Round trips: psycopg2 sends BEGIN on its own and ``atomic()`` sends COMMIT, so the claim and
the completion are one statement each (5 with the view's INSERT, where :class:`idempotency_pg.core.PgTx` sends 3).
"""

import functools
from contextlib import contextmanager

from . import core
from .responses import Problem, Response


def to_django(response):
    from django.http import HttpResponse

    r = HttpResponse(response.body, status=response.status)
    for k, v in response.headers:
        if k.lower() != "content-length":
            r[k] = v
    r["Content-Length"] = str(len(response.body))  # else the server answers chunked and closes the connection
    return r


def from_django(dresp):
    return Response(dresp.status_code, list(dresp.items()), dresp.content)


def request_target(request):
    """``(path, query)`` of a Django request as its request line had them (CONTRACT.md "raw-target"), not
    ``request.path`` (decoded): under ASGI its scope's (:func:`idempotency_pg.core.asgi_target`), under WSGI its
    environ's, ``request.META`` (:func:`idempotency_pg.core.wsgi_target`)."""
    scope = getattr(request, "scope", None)
    return core.asgi_target(scope) if scope is not None else core.wsgi_target(request.META)


def read_body(request, limit):
    """The whole body: a ``Content-Length`` over the limit refused before Django reads it, and fewer bytes than it
    (the client hung up) refused as incomplete.  Django keeps the bytes read (``request.body``), so the view's
    ``request.POST`` and ``request.FILES`` parse a form or multipart body from them as without the decorator."""
    length = core.content_length(request.META.get("CONTENT_LENGTH"))
    core.check_length(length, limit)
    return core.check_whole(request.body, length, limit)


class _DjangoTx:
    """One ``transaction.atomic(using)`` block per attempt, entered by the claim, left by complete or rollback."""

    def __init__(self, using):
        from django.db import connections

        self.using, self.handle, self.atomic = using, connections[using], None

    def _execute(self, sql, params):
        with self.handle.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()

    async def claim(self, params):
        from django.db import transaction

        self.atomic = transaction.atomic(using=self.using)
        self.atomic.__enter__()
        try:
            return core.claim_fields(self._execute(core.CLAIM_REQUEST, core.claim_args(params))[0])
        except Exception as e:
            if core.sqlstate(e) in core.BAD_BODY_STATES:
                raise core.BadBody() from e
            raise

    async def complete(self, params, response, replay_headers):
        self._execute(core.COMPLETE_REQUEST, core.complete_args(params, response, replay_headers))
        self.atomic, atomic = None, self.atomic
        atomic.__exit__(None, None, None)  # COMMIT (raises if it fails)
        return response

    async def rollback(self):
        from django.db import transaction

        if self.atomic is not None:
            self.atomic, atomic = None, self.atomic
            transaction.set_rollback(True, using=self.using)
            atomic.__exit__(None, None, None)


def idempotent(scope=None, *, using="default", **options):
    """Decorate a Django view so that each request with an ``Idempotency-Key`` runs at most once; ``scope(request)``
    and the other options: :class:`idempotency_pg.core.Options`."""
    opts = core.Options(scope=scope, **options)

    def decorator(view):
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            if request.method.upper() not in opts.methods:
                return view(request, *args, **kwargs)
            sent = {}

            async def run(ctx, raw):
                from django.core.handlers.exception import response_for_exception
                from django.db import DatabaseError

                request.idempotency = ctx
                try:
                    dresp = view(request, *args, **kwargs)
                except (core.NotExecuted, core.HTTPProblem, DatabaseError):
                    raise  # answered by the flow: not stored / as sent / rolled back
                except Exception as exc:  # noqa: BLE001 - answered as Django would, at its own boundary
                    dresp = response_for_exception(request, exc)
                if getattr(dresp, "streaming", False):
                    return opts.render_problem(Problem(500, "internal-error", "Internal Server Error",
                                                       "a streaming response cannot be stored"))
                sent["django"], sent["response"] = dresp, from_django(dresp)
                return sent["response"]

            path, query = request_target(request)
            out = core.drive(opts.respond(request, request.method.upper(), path,
                                          request.META.get("HTTP_IDEMPOTENCY_KEY"),
                                          lambda limit: read_body(request, limit), lambda: _transaction(using), run,
                                          query=query, content_type=request.META.get("CONTENT_TYPE")))
            if out is not None and out is sent.get("response"):
                return sent["django"]  # the view's own response object, sent as it made it
            return to_django(out)

        wrapper.options = opts  # the view's Options: other views can read a request as it does (intake)
        return wrapper

    return decorator


@contextmanager
def _transaction(using):
    yield _DjangoTx(using)


# --------------------------------------------------------------------------- lease mode

def lease_pool(using="default"):
    """Django's own connection as the pool of :func:`idempotency_pg.lease.run`, so that a step's ``commit`` and
    the ``finish`` run in ``transaction.atomic(using=using)`` and may write with the ORM::

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


__all__ = ["idempotent", "lease_pool", "request_target", "to_django", "from_django"]
