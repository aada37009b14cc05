"""POST /rides (clients/CONTRACT.md "lease-rides"): the rocket-rides story in lease mode, on the WSGI service.

Steps: ``charge_created`` (the simulated provider's charge, then the ride row and the checkpoint in one
transaction) and ``receipt_sent`` (the simulated mailer); then the 201 is stored with ``idem_lease_complete``.
"""

import logging
import os
import re
import time

from idempotency_pg import HTTPProblem, NotExecuted, json_response, problem
from idempotency_pg.lease import Step, run

from .app import account_scope, validate_payment

log = logging.getLogger("payments_service")

STALL_RE = re.compile(r"stall=(\d{1,7})\Z")
CRASH_STATUS = 70  # the process exits with it on the crash-* faults


def lease_seconds():
    return float(os.environ.get("RIDES_LEASE_SECONDS", "30"))


def handle_ride(pool, account, key, body_text, fault):
    """The ride for a parsed, authenticated request: returns the Response to send."""
    amount, currency = validate_payment(body_text)  # NotExecuted: answered before any lease

    def charge(ctx):
        if fault == "provider-503":
            raise _ProviderDown()
        with pool.connection() as conn:  # the "provider call": one autocommit statement, idempotent on the key
            (charge_id,) = conn.execute(
                "INSERT INTO provider_charges (account, idempotency_key, amount_cents, currency) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (account, idempotency_key) "
                "DO UPDATE SET amount_cents = EXCLUDED.amount_cents RETURNING charge_id",
                (account, key, amount, currency)).fetchone()
        if fault == "crash-after-charge":
            os._exit(CRASH_STATUS)
        m = STALL_RE.match(fault or "")
        if m:
            ctx.stop_heartbeat()  # a stalled holder: no heartbeat, the lease runs out, another attempt takes over
            time.sleep(int(m.group(1)) / 1000.0)
        return {"charge_id": charge_id}

    def insert_ride(conn, ctx, state):
        (ride_id,) = conn.execute(
            "INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id, fencing_number) "
            "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
            (account, key, amount, currency, state["charge_id"], ctx.fencing_number)).fetchone()
        return dict(state, ride_id=ride_id)

    def receipt(ctx):
        if fault == "crash-after-checkpoint":
            os._exit(CRASH_STATUS)
        with pool.connection() as conn:  # the "mailer": idempotent on the key
            conn.execute("INSERT INTO receipts (account, idempotency_key, ride_id) VALUES (%s, %s, %s) "
                         "ON CONFLICT DO NOTHING", (account, key, ctx.state["ride_id"]))
        return ctx.state

    def finish(conn, ctx):
        conn.execute("UPDATE rides SET receipt_sent = true WHERE id = %s", (ctx.state["ride_id"],))
        ride_id = ctx.state["ride_id"]
        return json_response(201, {"ride_id": ride_id, "account": account, "amount_cents": amount,
                                   "currency": currency, "charge_id": ctx.state["charge_id"]},
                             [("Location", "/rides/%d" % ride_id)])

    steps = [Step("charge_created", action=charge, commit=insert_ride), Step("receipt_sent", action=receipt)]
    try:
        return run(pool, key=key, scope=account, method="POST", path="/rides", body_text=body_text, steps=steps,
                   finish=finish, lease_seconds=lease_seconds())
    except _ProviderDown:
        return problem(503, "provider-unavailable", "Service Unavailable", "the payment provider answered 503")


class _ProviderDown(Exception):
    pass


__all__ = ["handle_ride", "HTTPProblem", "NotExecuted", "account_scope"]
