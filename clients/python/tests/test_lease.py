"""idempotency_pg.lease: the step API (lease, heartbeat, a checkpoint per step, complete, stop on 55000), each test
in every mode: :func:`run` on psycopg's ConnectionPool (the heartbeat a thread), :func:`run_async` on its
AsyncConnectionPool (ASGI services; async steps, the heartbeat an asyncio task) and :func:`run` on Django's own
connection (``idempotency_pg.django.lease_pool()``)."""

import asyncio
import json
import time

import psycopg
import pytest

from idempotency_pg import Response, json_response, problem, stored_form
from idempotency_pg.asgi import async_connection_pool
from idempotency_pg.core import aw, drive, driven, entered, fetchone
from idempotency_pg.lease import LEASE_SQL, Step, run, run_async

from conftest import needs_db, traced_round_trips
from test_integration import ledger
from wsgi_client import OneConnection

pytestmark = needs_db


class Sync:
    """:func:`run` on the tests' pool.  A step written as a coroutine function is driven to its end: every call it
    awaits is sync here, so it never suspends."""

    run = staticmethod(run)
    sleep = staticmethod(time.sleep)
    connect = staticmethod(psycopg.Connection.connect)
    fn = staticmethod(driven)

    def __init__(self, database_url, pool):
        self.pool = pool

    def main(self, body):
        return drive(body(self.pool))


class Async:
    """:func:`run_async` on a fresh AsyncConnectionPool in a fresh event loop; steps are coroutine functions."""

    run = staticmethod(run_async)
    sleep = staticmethod(asyncio.sleep)
    connect = staticmethod(psycopg.AsyncConnection.connect)

    def __init__(self, database_url, pool):
        self.database_url = database_url

    @staticmethod
    def fn(f):
        return f

    def main(self, body):
        async def main():
            pool = async_connection_pool(self.database_url, min_size=2, max_size=6, timeout=10)
            await pool.open(wait=True, timeout=30)
            try:
                return await body(pool)
            finally:
                await pool.close()
        return asyncio.run(main())


class Django(Sync):
    """:func:`run` on Django's own connection (``idempotency_pg.django.lease_pool()``): a step's commit and finish in
    ``transaction.atomic``, one statement per round trip; 55000 arrives wrapped in Django's OperationalError."""

    def __init__(self, database_url, pool):
        from idempotency_pg.django import lease_pool

        self.pool = lease_pool()


@pytest.fixture(params=[Sync, Async, Django], ids=["sync", "async", "django"])
def mode(request, database_url, pool):
    if request.param is Django:
        request.getfixturevalue("django_configured")
    return request.param(database_url, pool)


PSYCOPG = pytest.mark.parametrize("mode", [Sync, Async], ids=["sync", "async"], indirect=True)


RIDE_SQL = ("INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id, fencing_number) "
            "VALUES (%s, %s, 1, 'EUR', 'ch', %s) RETURNING id")


async def write_ride(conn, ctx, state=None):
    (ride,) = await fetchone(conn, RIDE_SQL, (ctx.scope, ctx.key, ctx.fencing_number))
    return dict(state or {}, ride=ride)


def rides(db, account):
    return db.execute("SELECT count(*) FROM rides WHERE account = %s", (account,)).fetchone()[0]


async def down(conn, ctx):
    """A finish that writes, then answers 503."""
    await write_ride(conn, ctx)
    return problem(503, "down", "Down")


def stall(mode, pool, account, key):
    """A step that stops its heartbeat and sleeps past its 1 s lease while another attempt takes ``key`` over."""
    async def step(ctx):
        ctx.stop_heartbeat()
        await aw(mode.sleep(1.2))
        other = await go(mode, pool, account, key, [Step("one", action=lambda c: {"by": "second"})])
        assert other.status == 201, other
        return {"by": "stalled"}
    return mode.fn(step)


async def finish(conn, ctx):
    (n,) = await fetchone(conn, "SELECT count(*) FROM rides WHERE account = %s", (ctx.scope,))
    return json_response(201, {"done": ctx.state, "rides": n}, [("Location", "/x")])


def go(mode, pool, account, key, steps, fin=None, lease=5.0, body='{"a": 1}'):
    return aw(mode.run(pool, key=key, scope=account, method="POST", path="/t", body_text=body, steps=steps,
                       finish=fin or mode.fn(finish), lease_seconds=lease))


def steps_log(mode, log, fail_at=None):
    """Two steps (coroutine functions: async steps under run_async) that log what they were given."""
    def action(name):
        async def act(ctx):
            log.append((name, ctx.recovery_point, dict(ctx.state), ctx.fencing_number))
            if name == fail_at:
                raise RuntimeError("crash in " + name)
            return dict(ctx.state, **{name: len(log)})
        return mode.fn(act)
    return [Step("one", action=action("one")), Step("two", action=action("two"))]


def test_runs_every_step_then_replays_the_same_bytes(mode, account):
    log = []

    async def body(pool):
        steps = steps_log(mode, log)
        steps[0].commit = mode.fn(write_ride)  # its write is in the checkpoint's transaction
        first = await go(mode, pool, account, "k", steps)
        again = await go(mode, pool, account, "k", steps_log(mode, log))
        other = await go(mode, pool, account, "k", steps_log(mode, log), body='{"a": 2}')
        return first, again, other
    first, again, other = mode.main(body)
    assert first.status == 201, first
    done = json.loads(first.body)
    assert done["rides"] == 1 and set(done["done"]) == {"one", "two", "ride"}
    assert [(n, rp) for n, rp, _, _ in log] == [("one", None), ("two", "one")]
    assert all(f is None or isinstance(f, int) for *_, f in log)  # 1.1: no fencing number; 1.2: a number
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (201, first.body, "true")
    assert other.status == 422
    assert len(log) == 2  # neither the replay nor the mismatch ran a step


def test_a_failed_step_releases_and_the_retry_resumes_after_the_last_checkpoint(mode, account):
    log = []

    async def body(pool):
        with pytest.raises(RuntimeError, match="crash in two"):
            await go(mode, pool, account, "k", steps_log(mode, log, fail_at="two"))
        return await go(mode, pool, account, "k", steps_log(mode, log))  # released at once: no wait for the lease
    assert mode.main(body).status == 201
    assert [(n, rp, st) for n, rp, st, _ in log] == [("one", None, {}), ("two", "one", {"one": 1}),
                                                     ("two", "one", {"one": 1})]


def test_5xx_is_not_stored_and_keeps_the_recovery_point(mode, db, account):
    """finish's writes roll back with its 5xx (the retry runs finish again: kept, they would be written twice),
    and the lease is released at once with the recovery point kept.  The steps are plain functions: run_async
    takes those too."""
    async def up(conn, ctx):
        await write_ride(conn, ctx)
        return await finish(conn, ctx)

    async def body(pool):
        r = await go(mode, pool, account, "k", [Step("one", action=lambda c: {"one": 1})], fin=mode.fn(down))
        assert r.status == 503 and rides(db, account) == 0 and stored(db, account) is None
        return await go(mode, pool, account, "k", [Step("one", action=lambda c: {"again": 1})], fin=mode.fn(up))
    r = mode.main(body)
    assert r.status == 201 and json.loads(r.body)["done"] == {"one": 1}  # resumed after "one": not run again
    assert rides(db, account) == 1


def stored(db, account):
    return db.execute("SELECT http_status, response_content_type, response_bytes FROM idempotency_keys "
                      "WHERE key = 'k' AND scope = %s AND http_status IS NOT NULL", (account,)).fetchone()


@pytest.mark.parametrize("ctype,sent", [("application/json", b'{"b": 2,  "a": [1.0, 1e2]}'),
                                        ("image/png", b"\x89PNG\r\n\x1a\n\x00\xff")], ids=["json", "binary"])
def test_the_bytes_answered_are_stored_and_replayed_as_they_are(mode, db, account, ctype, sent):
    """finish's bytes and content type are stored as sent (idem_lease_complete_request): the first answer and the
    replay are those bytes, JSON included (as jsonb it would be respelled: key order, spacing, 1e2)."""
    async def fin(conn, ctx):
        return Response(201, [("Content-Type", ctype), ("Location", "/x")], sent)

    async def body(pool):
        return await go(mode, pool, account, "k", [], fin=mode.fn(fin)), await go(mode, pool, account, "k", [])
    first, again = mode.main(body)
    assert (first.status, first.body, again.status, again.body) == (201, sent, 201, sent)
    # 1.4 (CONTRACT.md key-lifetime): the server adds the key's expiry to the stored headers of a replay
    assert [h for h in again.headers if h[0] != "Idempotency-Key-Expires"] == [
        ("Content-Type", ctype), ("Location", "/x"), ("Idempotent-Replayed", "true")]
    assert again.header("Idempotency-Key-Expires") and first.header("Idempotency-Key-Expires")
    assert stored(db, account) == (201, ctype, sent)


def test_a_key_completed_as_jsonb_by_a_1_2_client_still_replays(mode, db, account):
    """A key completed with idem_lease_complete as the 1.2 runner did (stored_form: text as a JSON string, its
    encoding in a header) replays its bytes and headers."""
    sent = Response(201, [("Content-Type", "text/plain; charset=utf-8"), ("Location", "/x")], "café\n".encode())
    lease = dict(key="k", method="POST", path="/t", body=b'{"a": 1}', content_type=None, lease=5.0, ttl=None, scope=account)
    token = db.execute("SELECT lease_token FROM (%s) AS l" % LEASE_SQL, lease).fetchone()[0]
    assert db.execute("SELECT idem_lease_complete(%s, %s, 201, %s::jsonb, %s::jsonb, %s)",
                      ("k", token, *stored_form(sent), account)).fetchone()[0]
    again = mode.main(lambda pool: go(mode, pool, account, "k", []))
    assert (again.status, again.body, sorted(again.headers)) == (201, sent.body, sorted(sent.headers + [
        ("Idempotent-Replayed", "true"), ("Idempotency-Key-Expires", again.header("Idempotency-Key-Expires"))]))
    assert again.header("Idempotency-Key-Expires").endswith(" GMT")


def test_in_progress_while_leased(mode, account):
    seen = []

    async def body(pool):
        async def slow(ctx):
            seen.append(await go(mode, pool, account, "k", []))  # a second attempt while the lease is live
            return ctx.state
        return await go(mode, pool, account, "k", [Step("one", action=mode.fn(slow))])
    assert mode.main(body).status == 201
    assert seen[0].status == 409 and seen[0].header("Retry-After") == "1"


def test_a_stalled_holder_gets_409_and_writes_nothing(mode, account):
    """The lease runs out during a step whose heartbeat was stopped; another attempt takes over and finishes;
    the stalled holder's checkpoint transaction is fenced off (55000) before its local write, and no further step
    runs."""
    wrote, later = [], []

    async def body(pool):
        async def local(conn, ctx, state):
            wrote.append(state)
            return state
        steps = [Step("one", action=stall(mode, pool, account, "k"), commit=mode.fn(local)),
                 Step("two", action=later.append)]
        r = await go(mode, pool, account, "k", steps, lease=1.0)
        return r, await go(mode, pool, account, "k", [])
    r, final = mode.main(body)
    assert r.status == 409 and r.header("Retry-After") == "1", r
    assert wrote == [] and later == []
    assert final.header("Idempotent-Replayed") == "true" and json.loads(final.body)["done"] == {"by": "second"}


@pytest.mark.parametrize("heartbeat", [True, False])
def test_the_heartbeat_keeps_a_long_step_leased(mode, account, heartbeat):
    """A 5 s step under a 2 s lease: at 3.5 s another attempt must still find the key in progress, as the
    heartbeat extends it every 2/3 s.  The control: with the heartbeat stopped, the lease runs out at 2 s, the
    attempt takes the key over and the holder gets 409."""
    seen = []

    async def body(pool):
        async def long_step(ctx):
            if not heartbeat:
                ctx.stop_heartbeat()
            await aw(mode.sleep(3.5))
            seen.append(await go(mode, pool, account, "k", [Step("one", action=lambda c: {"probe": True})], lease=2.0))
            await aw(mode.sleep(1.5))
            return {"long": True}
        return await go(mode, pool, account, "k", [Step("one", action=mode.fn(long_step))], lease=2.0)
    first = mode.main(body)
    if heartbeat:
        assert seen[0].status == 409, seen
        assert first.status == 201 and json.loads(first.body)["done"] == {"long": True}, first
    else:
        assert seen[0].status == 201, seen
        assert first.status == 409, first


def test_a_django_step_writes_with_the_orm_in_its_checkpoint_transaction(django_configured, db, account):
    """A step's ORM write commits with its checkpoint; a failed later step releases the lease, and the retry resumes
    after the checkpoint with its state (the ORM write is not made twice)."""
    from payments_service.djangoledger.models import Ledger

    def write(conn, ctx, state):
        row = Ledger.objects.create(account=ctx.scope, amount_cents=-1, currency="EUR", idempotency_key=ctx.key)
        return dict(state, ledger_id=row.id)

    def fail(ctx):
        raise RuntimeError("mailer down")
    mode = Django(None, None)

    async def body(pool):
        with pytest.raises(RuntimeError):
            await go(mode, pool, account, "k", [Step("written", action=lambda ctx: {"a": 1}, commit=write),
                                                Step("mailed", action=fail)])
        assert len(ledger(db, account)) == 1
        return await go(mode, pool, account, "k", [Step("written", action=lambda ctx: {"again": 1}, commit=write),
                                                   Step("mailed", action=lambda ctx: dict(ctx.state, mailed=True))])
    r = mode.main(body)
    assert r.status == 201, r
    done = json.loads(r.body)["done"]
    assert done["a"] == 1 and done["mailed"] is True and "again" not in done
    assert [row[0] for row in ledger(db, account)] == [done["ledger_id"]]


def test_the_sync_run_refuses_an_async_step(pool, account):
    async def step(ctx):
        return {}
    with pytest.raises(TypeError, match="run_async"):
        run(pool, key="k", scope=account, method="POST", path="/t", body_text="{}", steps=[Step("one", action=step)],
            finish=lambda conn, ctx: json_response(201, {}))
    r = run(pool, key="k", scope=account, method="POST", path="/t", body_text="{}", steps=[],
            finish=lambda conn, ctx: json_response(201, {}))
    assert r.status == 201  # the failed run released its lease at once


# --------------------------------------------------------------------------- round trips (libpq's trace)

@PSYCOPG
def test_a_step_transaction_takes_the_round_trips_of_a_bare_one(mode, database_url, account, tmp_path):
    """BEGIN travels with the fence, the checkpoint and the completion with COMMIT: a step whose commit writes one
    statement is 3 round trips (BEGIN + fence, the write, checkpoint + COMMIT), finish with one statement 3."""
    from psycopg.pq import Trace

    async def commit(conn, ctx, state):
        await aw(conn.execute("SELECT 1"))
        return dict(state, charged=1)

    trace = tmp_path / "trace"

    async def body(pool):
        conn = await aw(mode.connect(database_url, autocommit=True, prepare_threshold=None))
        async with entered(conn):
            with open(trace, "w") as f:
                conn.pgconn.trace(f.fileno())
                conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
                try:
                    return await aw(mode.run(OneConnection(conn), key="k", scope=account, method="POST", path="/t",
                                             body_text="{}", steps=[Step("charged", commit=mode.fn(commit))],
                                             finish=mode.fn(finish), lease_seconds=30))
                finally:
                    conn.pgconn.untrace()  # flushes the trace
    assert mode.main(body).status == 201
    assert traced_round_trips(trace) == [
        "idem_lease",  # autocommit
        "BEGIN; idem_lease_extend", "SELECT 1", "idem_checkpoint; COMMIT",  # the step
        "BEGIN; idem_lease_extend", "SELECT count(*) FROM rides WHERE account = $1",
        "idem_lease_complete_request; COMMIT",
    ]


@PSYCOPG
def test_a_fenced_off_or_5xx_step_transaction_is_rolled_back_before_the_connection_goes_back(mode, database_url, db,
                                                                                             account):
    """The BEGIN sent with the fence and finish's writes before a 5xx are not left open on the connection."""
    from psycopg.pq import TransactionStatus

    async def body(pool):
        conn = await aw(mode.connect(database_url, autocommit=True, prepare_threshold=None))
        async with entered(conn):
            one_conn = OneConnection(conn)
            assert (await go(mode, one_conn, account, "k", [], fin=mode.fn(down))).status == 503
            assert conn.info.transaction_status == TransactionStatus.IDLE and rides(db, account) == 0
            assert (await go(mode, one_conn, account, "k", [])).status == 201  # released: finish runs again
            assert conn.info.transaction_status == TransactionStatus.IDLE
            wrote = []
            r = await go(mode, one_conn, account, "k2", [
                Step("one", action=stall(mode, pool, account, "k2"), commit=lambda c, ctx, st: wrote.append(st))],
                lease=1.0)
            assert r.status == 409 and wrote == []  # 55000 from the fence, sent with BEGIN: nothing written
            assert conn.info.transaction_status == TransactionStatus.IDLE
    mode.main(body)
