"""idempotency_pg.django: the claim inside transaction.atomic() on Django's own connection, ORM writes in the same
transaction, the status committed the one Django answers (its own error boundary), not-executed, byte-identical
replays.  Against a real database (IDEM_TEST_DATABASE_URL), with Django's RequestFactory."""

import json

import pytest

from conftest import needs_db
from test_integration import ledger, stored_outcome

pytestmark = needs_db


@pytest.fixture(scope="module")
def dj(database_url):
    from payments_service.django_app import configure

    configure(database_url, faults=True)
    from django.test import RequestFactory

    yield RequestFactory()
    from django.db import connections
    connections.close_all()


def view_of(then):
    """A view that writes a ledger row with the ORM, then does ``then()``; decorated with idempotent()."""
    from idempotency_pg.django import idempotent
    from payments_service.djangoledger.models import Ledger

    @idempotent(scope=lambda request: request.META["HTTP_X_ACCOUNT"])
    def view(request):
        ctx = request.idempotency
        Ledger.objects.create(account=ctx.scope, amount_cents=-1, currency="EUR", idempotency_key=ctx.key)
        return then(request)
    return view


def post(dj, view, account, key="k", body=b'{"amount_cents": 1}', **extra):
    request = dj.post("/pay", data=body, content_type="application/json", HTTP_X_ACCOUNT=account,
                      HTTP_IDEMPOTENCY_KEY=key, **extra)
    return view(request)


def test_created_then_byte_identical_replay(dj, db, account):
    from django.http import HttpResponse

    view = view_of(lambda r: HttpResponse(b'{"z": 1,  "a": [2.50]}', status=201, content_type="application/json"))
    first, again = post(dj, view, account), post(dj, view, account)
    assert first.status_code == again.status_code == 201
    assert first.content == again.content and json.loads(first.content) == {"z": 1, "a": [2.5]}
    assert again["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert len(ledger(db, account)) == 1


def test_permission_denied_after_a_write_is_committed_as_django_answers_it(dj, db, account):
    from django.core.exceptions import PermissionDenied

    def then(request):
        raise PermissionDenied("after the write")
    view = view_of(then)
    first, again = post(dj, view, account), post(dj, view, account)
    assert first.status_code == 403, first.content  # Django's own answer for PermissionDenied
    assert again.status_code == 403 and again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert len(ledger(db, account)) == 1


@pytest.mark.parametrize("kind", ["exception", "502", "http-problem-503"])
def test_error_after_a_write_rolls_back(dj, db, account, kind):
    from django.http import HttpResponse

    from idempotency_pg import HTTPProblem

    def then(request):
        if kind == "exception":
            raise RuntimeError("boom")
        if kind == "502":
            return HttpResponse("bad gateway", status=502)
        raise HTTPProblem(503, "down", "Down")
    r = post(dj, view_of(then), account)
    assert r.status_code == {"exception": 500, "502": 502, "http-problem-503": 503}[kind]
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


def test_database_error_in_the_view_is_500_and_rolls_back(dj, db, account):
    from django.db import connection

    def then(request):
        with connection.cursor() as cur:
            cur.execute("SELECT 1/0")
    r = post(dj, view_of(then), account)
    assert r.status_code == 500 and "22012" in json.loads(r.content)["detail"]
    assert ledger(db, account) == []


def test_not_executed(dj, db, account):
    from idempotency_pg import NotExecuted, problem

    def then(request):
        raise NotExecuted(problem(422, "invalid", "Invalid"))
    view = view_of(then)
    assert post(dj, view, account).status_code == 422
    again = post(dj, view, account)
    assert again.status_code == 422 and not again.has_header("Idempotent-Replayed")
    assert ledger(db, account) == [] and stored_outcome(db, account, "k") == "claimed"


def test_the_service_view_validation_is_not_executed_and_limits(dj, db, account):
    from payments_service.django_app import payments

    def pay(key, body, **extra):
        request = dj.post("/payments", data=body, content_type="application/json",
                          HTTP_AUTHORIZATION="Bearer " + account, HTTP_IDEMPOTENCY_KEY=key, **extra)
        return payments(request)

    assert pay("v", b'{"amount_cents": 0, "currency": "EUR"}').status_code == 422
    ok = pay("v", b'{"amount_cents": 5, "currency": "EUR"}')
    assert ok.status_code == 201, ok.content
    assert pay("k1,k2", b'{"amount_cents": 5, "currency": "EUR"}').status_code == 400
    big = b'{"amount_cents": 5, "currency": "EUR"' + b" " * (2 * 1024 * 1024) + b"}"
    r = pay("big", big)
    assert r.status_code == 413 and json.loads(r.content)["type"].endswith("/request-too-large")
    assert [row[1] for row in ledger(db, account)] == [-5]




# --------------------------------------------------------------------------- lease mode on Django's connection

def lease_run(account, steps, lease=5.0):
    from idempotency_pg import json_response
    from idempotency_pg.django import lease_pool
    from idempotency_pg.lease import run

    return run(lease_pool(), key="k", scope=account, method="POST", path="/rides", body_text="{}", steps=steps,
               finish=lambda conn, ctx: json_response(201, ctx.state), lease_seconds=lease)


def test_lease_steps_write_with_the_orm_in_the_checkpoint_transaction(dj, db, account):
    """A step's ORM write commits with its checkpoint; a failed later step releases the lease, and the retry
    resumes after the checkpoint with its state (the ORM write is not made twice)."""
    from idempotency_pg.lease import Step
    from payments_service.djangoledger.models import Ledger

    def write(conn, ctx, state):
        row = Ledger.objects.create(account=ctx.scope, amount_cents=-1, currency="EUR", idempotency_key=ctx.key)
        return dict(state, ledger_id=row.id)

    def fail(ctx):
        raise RuntimeError("mailer down")
    with pytest.raises(RuntimeError):
        lease_run(account, [Step("written", action=lambda ctx: {"a": 1}, commit=write), Step("mailed", action=fail)])
    assert len(ledger(db, account)) == 1
    r = lease_run(account, [Step("written", action=lambda ctx: {"again": 1}, commit=write),
                            Step("mailed", action=lambda ctx: dict(ctx.state, mailed=True))])
    assert r.status == 201, r
    body = json.loads(r.body)
    assert body["a"] == 1 and body["mailed"] is True and "again" not in body
    assert [row[0] for row in ledger(db, account)] == [body["ledger_id"]]


def test_lease_takeover_on_django_stops_the_stalled_holder_with_409(dj, db, account):
    """55000 arrives wrapped in Django's OperationalError (psycopg2's error as its cause): still a clean 409,
    and the holder's ORM write in its checkpoint transaction never happens."""
    import time

    from idempotency_pg.lease import Step

    wrote = []

    def stall(ctx):
        ctx.stop_heartbeat()
        time.sleep(1.2)  # past the 1 s lease
        other = lease_run(account, [Step("one", action=lambda c: {"by": "second"})])
        assert other.status == 201, other
        return {"by": "stalled"}

    def local(conn, ctx, state):
        wrote.append(state)
        return state
    r = lease_run(account, [Step("one", action=stall, commit=local)], lease=1.0)
    assert r.status == 409 and r.header("Retry-After") == "1", r
    assert wrote == []


def test_a_short_body_is_not_executed(dj, db, account):
    """Fewer bytes than the Content-Length reach Django (the client hung up): nothing claimed, nothing written."""
    import io

    from django.core.handlers.wsgi import WSGIRequest

    from payments_service.django_app import payments

    environ = dj._base_environ(PATH_INFO="/payments", REQUEST_METHOD="POST", CONTENT_LENGTH="600",
                               CONTENT_TYPE="application/json", HTTP_AUTHORIZATION="Bearer " + account,
                               HTTP_IDEMPOTENCY_KEY="short")
    environ["wsgi.input"] = io.BytesIO(b'{"amount_cents":100,"currency":"EUR"}')
    r = payments(WSGIRequest(environ))
    assert r.status_code == 400 and json.loads(r.content)["type"].endswith("/request-body-incomplete"), r.content
    assert ledger(db, account) == [] and stored_outcome(db, account, "short") == "claimed"
