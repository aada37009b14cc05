"""idempotency_pg.django beyond the checks every adapter passes (test_adapters.py): the sample service's view, and
lease mode on Django's own connection with ORM writes.  With Django's RequestFactory."""

import json

import pytest

from conftest import needs_db
from test_integration import ledger

pytestmark = needs_db


@pytest.fixture(scope="module")
def dj(database_url):
    from payments_service.django_app import configure

    configure(database_url, faults=True)
    from django.test import RequestFactory

    yield RequestFactory()
    from django.db import connections
    connections.close_all()


def test_the_service_view_validation_is_not_executed(dj, db, account):
    """The service's view (its ORM insert) behind the decorator: an invalid payment is not executed, so the corrected
    retry with the same key runs."""
    from payments_service.django_app import payments

    def pay(body):
        return payments(dj.post("/payments", data=body, content_type="application/json",
                                HTTP_AUTHORIZATION="Bearer " + account, HTTP_IDEMPOTENCY_KEY="v"))

    assert pay(b'{"amount_cents": 0, "currency": "EUR"}').status_code == 422
    ok = pay(b'{"amount_cents": 5, "currency": "EUR"}')
    assert ok.status_code == 201, ok.content
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

