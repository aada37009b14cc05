"""idempotency_pg.lease: the step API (lease, heartbeat, a checkpoint per step, complete, stop on 55000)."""

import contextlib
import json
import time

import pytest

from idempotency_pg import json_response, problem
from idempotency_pg.lease import Step, run

from conftest import needs_db, traced_round_trips

pytestmark = needs_db


def steps_log(log, fail_at=None):
    def action(name):
        def act(ctx):
            log.append((name, ctx.recovery_point, dict(ctx.state), ctx.fencing_number))
            if name == fail_at:
                raise RuntimeError("crash in " + name)
            return dict(ctx.state, **{name: len(log)})
        return act
    return [Step("one", action=action("one")), Step("two", action=action("two"))]


def finish(conn, ctx):
    return json_response(201, {"done": ctx.state, "n": 1}, [("Location", "/x")])


def go(pool, account, key, steps, fin=finish, lease=5.0, body='{"a": 1}'):
    return run(pool, key=key, scope=account, method="POST", path="/t", body_text=body, steps=steps, finish=fin,
               lease_seconds=lease)


def test_runs_every_step_then_replays_the_same_bytes(pool, account):
    log = []
    first = go(pool, account, "k", steps_log(log))
    assert first.status == 201 and json.loads(first.body)["done"] == {"one": 1, "two": 2}
    assert [(n, rp) for n, rp, _, _ in log] == [("one", None), ("two", "one")]
    assert all(f is None or isinstance(f, int) for *_, f in log)  # 1.1: no fencing number; 1.2: a number
    again = go(pool, account, "k", steps_log(log))
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (201, first.body, "true")
    assert len(log) == 2  # nothing ran again
    other = go(pool, account, "k", steps_log(log), body='{"a": 2}')
    assert other.status == 422


def test_a_failed_step_releases_and_the_retry_resumes_after_the_last_checkpoint(pool, account):
    log = []
    with pytest.raises(RuntimeError):
        go(pool, account, "k", steps_log(log, fail_at="two"))
    r = go(pool, account, "k", steps_log(log))  # the lease was released at once: no wait
    assert r.status == 201
    assert [(n, rp, st) for n, rp, st, _ in log] == [("one", None, {}), ("two", "one", {"one": 1}),
                                                     ("two", "one", {"one": 1})]


def test_5xx_is_not_stored_and_keeps_the_recovery_point(pool, db, account):
    """finish's writes roll back with its 5xx (the retry runs finish again: kept, they would be written twice),
    and the lease is released at once with the recovery point kept."""
    log = []

    def down(conn, ctx):
        conn.execute(RIDE_SQL, (ctx.scope, ctx.key))
        return problem(503, "down", "Down")
    def up(conn, ctx):
        conn.execute(RIDE_SQL, (ctx.scope, ctx.key))
        return finish(conn, ctx)
    r = go(pool, account, "k", steps_log(log), fin=down)
    assert r.status == 503
    assert rides(db, account) == 0
    r = go(pool, account, "k", steps_log(log), fin=up)
    assert r.status == 201 and len(log) == 2  # resumed after "two": no step ran again
    assert rides(db, account) == 1


RIDE_SQL = ("INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id) "
            "VALUES (%s, %s, 1, 'EUR', 'ch')")


def rides(db, account):
    return db.execute("SELECT count(*) FROM rides WHERE account = %s", (account,)).fetchone()[0]


def test_in_progress_while_leased(pool, account):
    seen = []

    def slow(ctx):
        seen.append(go(pool, account, "k", []))  # a second attempt while the lease is live
        return ctx.state
    r = go(pool, account, "k", [Step("one", action=slow)])
    assert r.status == 201
    assert seen[0].status == 409 and seen[0].header("Retry-After") == "1"


def test_a_stalled_holder_gets_409_and_writes_nothing(pool, db, account):
    """The lease runs out during a step whose heartbeat was stopped; another attempt takes over and finishes;
    the stalled holder's checkpoint transaction is fenced off (55000) before its local write."""
    wrote = []

    def takeover_during(ctx):
        ctx.stop_heartbeat()
        time.sleep(1.2)  # past the 1 s lease
        other = go(pool, account, "k", [Step("one", action=lambda c: {"by": "second"})], lease=5.0)
        assert other.status == 201, other
        return {"by": "stalled"}

    def local(conn, ctx, state):
        wrote.append(state)
        return state
    r = go(pool, account, "k", [Step("one", action=takeover_during, commit=local)], lease=1.0)
    assert r.status == 409, r
    assert wrote == []
    final = go(pool, account, "k", [])
    assert final.header("Idempotent-Replayed") == "true" and json.loads(final.body)["done"] == {"by": "second"}


def test_heartbeat_keeps_a_long_step_alive(pool, account):
    seen = []

    def long_step(ctx):
        time.sleep(5)  # 2.5 leases of 2 s: the heartbeat extends every 2/3 s (1.3 s of margin on a busy box)
        return ctx.state

    def probe(ctx):
        seen.append(go(pool, account, "k", []))
        return ctx.state
    r = go(pool, account, "k", [Step("one", action=long_step), Step("two", action=probe)], lease=2.0)
    assert r.status == 201, r
    assert seen[0].status == 409  # still ours: no takeover happened during the long step


# --------------------------------------------------------------------------- round trips (libpq's trace)

class OneConnection:
    """A pool of one autocommit connection (traced, or checked for a transaction left open)."""

    def __init__(self, conn):
        self.conn = conn

    @contextlib.contextmanager
    def connection(self):
        yield self.conn


def test_a_step_transaction_takes_the_round_trips_of_a_bare_one(database_url, account, tmp_path):
    """BEGIN travels with the fence, the checkpoint and the completion with COMMIT: a step whose commit writes one
    statement is 3 round trips (BEGIN + fence, the write, checkpoint + COMMIT), finish with no statement 2."""
    import psycopg
    from psycopg.pq import Trace

    trace = tmp_path / "trace"
    with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn, open(trace, "w") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        steps = [Step("charged", commit=lambda c, ctx, state: c.execute("SELECT 1") and dict(state, charged=1))]
        r = run(OneConnection(conn), key="k", scope=account, method="POST", path="/t", body_text="{}",
                steps=steps, finish=finish, lease_seconds=30)
        conn.pgconn.untrace()  # flushes the trace
    assert r.status == 201
    assert traced_round_trips(trace) == [
        "idem_lease",  # autocommit
        "BEGIN; idem_lease_extend", "SELECT 1", "idem_checkpoint; COMMIT",  # the step
        "BEGIN; idem_lease_extend", "idem_lease_complete; COMMIT",  # finish
    ]


def test_a_fenced_off_or_5xx_step_transaction_is_rolled_back_before_the_connection_goes_back(pool, database_url, db,
                                                                                             account):
    """The BEGIN sent with the fence and finish's writes before a 5xx are not left open on the connection."""
    import psycopg
    from psycopg.pq import TransactionStatus

    def down(conn, ctx):
        conn.execute(RIDE_SQL, (ctx.scope, ctx.key))
        return problem(503, "down", "Down")

    def takeover_during(ctx):
        ctx.stop_heartbeat()
        time.sleep(1.2)  # past the 1 s lease
        other = go(pool, account, "k2", [Step("one", action=lambda c: {"by": "second"})], lease=5.0)
        assert other.status == 201, other
        return {"by": "stalled"}

    with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn:
        one = OneConnection(conn)
        assert go(one, account, "k", [], fin=down).status == 503
        assert conn.info.transaction_status == TransactionStatus.IDLE and rides(db, account) == 0
        assert go(one, account, "k", []).status == 201  # released at once: the retry runs finish again
        assert conn.info.transaction_status == TransactionStatus.IDLE
        wrote = []
        r = go(one, account, "k2", [Step("one", action=takeover_during, commit=lambda c, ctx, st: wrote.append(st))],
               lease=1.0)
        assert r.status == 409 and wrote == []  # 55000 from the fence, sent with BEGIN: nothing written
        assert conn.info.transaction_status == TransactionStatus.IDLE
