"""idempotency_pg.lease.run_async: the step API on psycopg's AsyncConnectionPool (ASGI services), with async
steps and the heartbeat as an asyncio task."""

import asyncio
import json

import pytest

from idempotency_pg import json_response, problem
from idempotency_pg.asgi import async_connection_pool
from idempotency_pg.lease import Step, run, run_async

from conftest import needs_db
from test_lease import steps_log

pytestmark = needs_db


def with_pool(database_url, body):
    """Run ``body(pool)`` (a coroutine function) on a fresh async pool in a fresh event loop."""
    async def main():
        pool = async_connection_pool(database_url, min_size=2, max_size=6, timeout=10)
        await pool.open(wait=True, timeout=30)
        try:
            return await body(pool)
        finally:
            await pool.close()
    return asyncio.run(main())


async def finish(conn, ctx):
    (n,) = await (await conn.execute("SELECT count(*) FROM rides WHERE account = %s", (ctx.scope,))).fetchone()
    return json_response(201, {"done": ctx.state, "rides": n}, [("Location", "/x")])


def go(pool, account, key, steps, fin=finish, lease=5.0, body='{"a": 1}'):
    return run_async(pool, key=key, scope=account, method="POST", path="/t", body_text=body, steps=steps,
                     finish=fin, lease_seconds=lease)


def logged(log, fail_at=None):
    """test_lease's two logging steps, made async (each yields to the event loop first)."""
    def as_async(action):
        async def act(ctx):
            await asyncio.sleep(0)
            return action(ctx)
        return act
    return [Step(s.name, action=as_async(s.action)) for s in steps_log(log, fail_at)]


def test_async_steps_run_checkpoint_complete_and_replay(database_url, account):
    log = []

    async def insert(conn, ctx, state):  # an async commit: its write is in the checkpoint's transaction
        cur = await conn.execute("INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id, "
                                 "fencing_number) VALUES (%s, %s, 1, 'EUR', 'ch', %s) RETURNING id",
                                 (ctx.scope, ctx.key, ctx.fencing_number))
        return dict(state, ride=(await cur.fetchone())[0])

    async def body(pool):
        steps = logged(log)
        steps[0].commit = insert
        first = await go(pool, account, "k", steps)
        again = await go(pool, account, "k", logged(log))
        other = await go(pool, account, "k", logged(log), body='{"a": 2}')
        return first, again, other
    first, again, other = with_pool(database_url, body)
    assert first.status == 201, first
    done = json.loads(first.body)
    assert done["rides"] == 1 and set(done["done"]) == {"one", "two", "ride"}
    assert [(n, rp) for n, rp, _, _ in log] == [("one", None), ("two", "one")]
    assert all(f is None or isinstance(f, int) for *_, f in log)  # 1.1: None; 1.2: the fencing number
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (201, first.body, "true")
    assert other.status == 422
    assert len(log) == 2  # neither the replay nor the mismatch ran a step


def test_a_failed_step_releases_and_the_retry_resumes_from_the_recovery_point(database_url, account):
    log = []

    async def body(pool):
        with pytest.raises(RuntimeError, match="crash in two"):
            await go(pool, account, "k", logged(log, fail_at="two"))
        return await go(pool, account, "k", logged(log))  # released at once: no wait for the lease
    r = with_pool(database_url, body)
    assert r.status == 201, r
    assert [(n, rp, st) for n, rp, st, _ in log] == [("one", None, {}), ("two", "one", {"one": 1}),
                                                     ("two", "one", {"one": 1})]


def test_takeover_gives_the_stalled_holder_409_and_it_stops_cleanly(database_url, account):
    """The holder's lease runs out in a step whose heartbeat it stopped; another attempt takes the key over and
    finishes.  The holder's checkpoint transaction gets 55000 at its fence: no local write, no further step, 409."""
    wrote, later = [], []

    async def stall(ctx):
        ctx.stop_heartbeat()
        await asyncio.sleep(3)  # the second attempt takes the key over meanwhile
        return {"by": "stalled"}

    async def local(conn, ctx, state):
        wrote.append(state)
        return state

    async def body(pool):
        holder = asyncio.ensure_future(go(pool, account, "k", [Step("one", action=stall, commit=local),
                                                               Step("two", action=later.append)], lease=1.0))
        await asyncio.sleep(1.5)  # the 1 s lease is over (it started before this sleep); the holder sleeps on
        second = await go(pool, account, "k", [Step("one", action=lambda c: {"by": "second"})], lease=5.0)
        first = await holder
        final = await go(pool, account, "k", [])
        return first, second, final
    first, second, final = with_pool(database_url, body)
    assert second.status == 201, second
    assert first.status == 409 and first.header("Retry-After") == "1", first
    assert wrote == [] and later == []
    assert final.header("Idempotent-Replayed") == "true" and json.loads(final.body)["done"] == {"by": "second"}


@pytest.mark.parametrize("heartbeat", [True, False])
def test_the_heartbeat_task_keeps_a_long_step_leased(database_url, account, heartbeat):
    """A 5 s step under a 2 s lease: at 3.5 s another attempt must still find the key in progress, as the
    heartbeat extends it every 2/3 s.  The control: with the heartbeat stopped, the lease runs out at 2 s, the
    attempt takes the key over and the holder gets 409."""
    async def long_step(ctx):
        if not heartbeat:
            ctx.stop_heartbeat()
        await asyncio.sleep(5)
        return {"long": True}

    async def body(pool):
        holder = asyncio.ensure_future(go(pool, account, "k", [Step("one", action=long_step)], lease=2.0))
        await asyncio.sleep(3.5)
        probe = await go(pool, account, "k", [Step("one", action=lambda c: {"probe": True})], lease=2.0)
        return await holder, probe
    first, probe = with_pool(database_url, body)
    if heartbeat:
        assert probe.status == 409, probe
        assert first.status == 201 and json.loads(first.body)["done"] == {"long": True}, first
    else:
        assert probe.status == 201, probe
        assert first.status == 409, first


def test_sync_steps_run_too_and_a_5xx_is_not_stored(database_url, account):
    async def body(pool):
        down = await go(pool, account, "k", [Step("one", action=lambda c: {"one": 1})],
                        fin=lambda conn, ctx: problem(503, "down", "Down"))
        ok = await go(pool, account, "k", [Step("one", action=lambda c: {"again": 1})])
        return down, ok
    down, ok = with_pool(database_url, body)
    assert down.status == 503
    assert ok.status == 201 and json.loads(ok.body)["done"] == {"one": 1}  # resumed after "one": not run again


def test_the_sync_run_refuses_an_async_step(pool, account):
    async def step(ctx):
        return {}
    with pytest.raises(TypeError, match="run_async"):
        run(pool, key="k", scope=account, method="POST", path="/t", body_text="{}", steps=[Step("one", action=step)],
            finish=lambda conn, ctx: json_response(201, {}))
    r = run(pool, key="k", scope=account, method="POST", path="/t", body_text="{}", steps=[],
            finish=lambda conn, ctx: json_response(201, {}))
    assert r.status == 201  # the failed run released its lease at once


def test_a_step_transaction_takes_the_round_trips_of_a_bare_one(database_url, account, tmp_path):
    """run_async as run (test_lease's test of the same name): BEGIN with the fence, COMMIT with the checkpoint and
    with the completion."""
    import contextlib

    import psycopg
    from psycopg.pq import Trace

    from conftest import traced_round_trips

    class OneTracedConnection:
        def __init__(self, conn):
            self.conn = conn

        @contextlib.asynccontextmanager
        async def connection(self):
            yield self.conn

    async def commit(conn, ctx, state):
        await conn.execute("SELECT 1")
        return dict(state, charged=1)

    trace = tmp_path / "trace"

    async def main():
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True,
                                                         prepare_threshold=None) as conn:
            with open(trace, "w") as f:
                conn.pgconn.trace(f.fileno())
                conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
                try:
                    return await run_async(OneTracedConnection(conn), key="k", scope=account, method="POST",
                                           path="/t", body_text="{}", steps=[Step("charged", commit=commit)],
                                           finish=finish, lease_seconds=30)
                finally:
                    conn.pgconn.untrace()  # flushes the trace

    assert asyncio.run(main()).status == 201
    assert traced_round_trips(trace) == [
        "idem_lease",
        "BEGIN; idem_lease_extend", "SELECT 1", "idem_checkpoint; COMMIT",
        "BEGIN; idem_lease_extend", "SELECT count(*) FROM rides WHERE account = $1", "idem_lease_complete; COMMIT",
    ]
