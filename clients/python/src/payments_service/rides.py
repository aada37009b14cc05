"""POST /rides (clients/CONTRACT.md "lease-rides"): the rocket-rides story in lease mode, on every Python service.

Steps: ``charge_created`` (the simulated provider's charge, then the ride row and the checkpoint in one
transaction) and ``receipt_sent`` (the simulated mailer); then the 201 is stored as sent
(``idem_lease_complete_request``).
:func:`handle_ride` runs them with :func:`idempotency_pg.lease.run` on a sync pool (the WSGI service's psycopg
pool, or Django's own connection through ``idempotency_pg.django.lease_pool()``); :func:`handle_ride_async`
with :func:`idempotency_pg.lease.run_async` on the FastAPI service's async pool, both from the same steps
(:func:`ride_steps`).
"""

import asyncio
import logging
import os
import re
import time

from idempotency_pg import NotExecuted, json_response, problem
from idempotency_pg.core import aw, driven, entered, fetchone
from idempotency_pg.lease import Step, run, run_async

from .payment import payment_from_bytes

log = logging.getLogger("payments_service")

STALL_RE = re.compile(r"stall=(\d{1,7})\Z")
CRASH_STATUS = 70  # the process exits with it on the crash-* faults

# The "provider call": one autocommit statement, idempotent on the key (a repeated call returns the first charge).
CHARGE_SQL = ("INSERT INTO provider_charges (account, idempotency_key, amount_cents, currency) "
              "VALUES (%s, %s, %s, %s) ON CONFLICT (account, idempotency_key) "
              "DO UPDATE SET amount_cents = EXCLUDED.amount_cents RETURNING charge_id")
RIDE_SQL = ("INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id, fencing_number) "
            "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id")
# The "mailer": idempotent on the key.
RECEIPT_SQL = ("INSERT INTO receipts (account, idempotency_key, ride_id) VALUES (%s, %s, %s) "
               "ON CONFLICT DO NOTHING")
RECEIPT_SENT_SQL = "UPDATE rides SET receipt_sent = true WHERE id = %s"

def lease_seconds():
    return float(os.environ.get("RIDES_LEASE_SECONDS", "30"))


async def ride_request(options, request, key_header, read_body, fault=None):
    """A :class:`Ride`, or the Response refusing the request before any lease (nothing written): the service's
    ``options`` (:class:`idempotency_pg.core.Options`, its scope) read the request as for ``POST /payments``."""
    params = await options.intake(request, "POST", "/rides", key_header, read_body)
    if not isinstance(params, dict):
        return params
    try:
        return Ride(params, fault)
    except NotExecuted as e:
        return e.response  # invalid: a 422 before any lease


class Ride:
    """A ride request read whole (``params`` of :meth:`idempotency_pg.core.Options.intake`) and validated."""

    def __init__(self, params, fault=None):
        self.amount, self.currency = payment_from_bytes(params["content_type"], params["raw"])
        self.account, self.key, self.fault = params["scope"], params["key"], fault
        self.body, self.content_type = params["raw"], params["content_type"]

    def run_args(self, steps, finish):
        return dict(key=self.key, scope=self.account, method="POST", path="/rides", body=self.body,
                    content_type=self.content_type,
                    steps=steps, finish=finish, lease_seconds=lease_seconds())

    def charge_args(self):
        return (self.account, self.key, self.amount, self.currency)

    def ride_args(self, ctx, state):
        return (self.account, self.key, self.amount, self.currency, state["charge_id"], ctx.fencing_number)

    def receipt_args(self, ctx):
        return (self.account, self.key, ctx.state["ride_id"])

    def before_charge(self):
        if self.fault == "provider-503":
            raise ProviderDown()

    def after_charge(self, ctx):
        """The faults right after the provider call: exit, or the seconds to stall (the heartbeat stopped)."""
        if self.fault == "crash-after-charge":
            os._exit(CRASH_STATUS)
        m = STALL_RE.match(self.fault or "")
        if not m:
            return 0
        ctx.stop_heartbeat()  # a stalled holder: no heartbeat, the lease runs out, another attempt takes over
        return int(m.group(1)) / 1000.0

    def before_receipt(self):
        if self.fault == "crash-after-checkpoint":
            os._exit(CRASH_STATUS)

    def created(self, state):
        ride_id = state["ride_id"]
        return json_response(201, {"ride_id": ride_id, "account": self.account, "amount_cents": self.amount,
                                   "currency": self.currency, "charge_id": state["charge_id"]},
                             [("Location", "/rides/%d" % ride_id)])


def ride_steps(pool, ride, sleep, as_step):
    """The ride's steps and finish on ``pool`` (sync or async), written once as coroutine functions: ``as_step``
    makes each what the lease runner takes, ``sleep`` stalls."""

    async def charge(ctx):
        ride.before_charge()
        async with entered(pool.connection()) as conn:
            (charge_id,) = await fetchone(conn, CHARGE_SQL, ride.charge_args())
        await aw(sleep(ride.after_charge(ctx)))
        return {"charge_id": charge_id}

    async def insert_ride(conn, ctx, state):
        (ride_id,) = await fetchone(conn, RIDE_SQL, ride.ride_args(ctx, state))
        return dict(state, ride_id=ride_id)

    async def receipt(ctx):
        ride.before_receipt()
        async with entered(pool.connection()) as conn:
            await aw(conn.execute(RECEIPT_SQL, ride.receipt_args(ctx)))
        return ctx.state

    async def finish(conn, ctx):
        await aw(conn.execute(RECEIPT_SENT_SQL, (ctx.state["ride_id"],)))
        return ride.created(ctx.state)

    steps = [Step("charge_created", action=as_step(charge), commit=as_step(insert_ride)),
             Step("receipt_sent", action=as_step(receipt))]
    return ride.run_args(steps, as_step(finish))


def handle_ride(pool, ride):
    """The ride on a sync pool: returns the Response to send."""
    try:
        return run(pool, **ride_steps(pool, ride, time.sleep, driven))
    except Exception as e:  # noqa: BLE001 - the answer to any failure of a step
        return failed(e)


async def handle_ride_async(pool, ride):
    """The ride on a ``psycopg_pool.AsyncConnectionPool``: returns the Response to send."""
    try:
        return await run_async(pool, **ride_steps(pool, ride, asyncio.sleep, lambda fn: fn))
    except Exception as e:  # noqa: BLE001
        return failed(e)


def failed(exc):
    """The answer when a step failed (the lease was released, its recovery point kept)."""
    if isinstance(exc, ProviderDown):
        return problem(503, "provider-unavailable", "Service Unavailable", "the payment provider answered 503")
    log.error("rides failed", exc_info=exc)
    return problem(500, "internal-error", "Internal Server Error", "the ride failed; retry it")


class ProviderDown(Exception):
    pass


__all__ = ["Ride", "handle_ride", "handle_ride_async", "ride_request"]
