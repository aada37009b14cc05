"""The Python client's named statements through the stack's real PgBouncer 1.18 in transaction pooling
(idempotency_pg.core.PgTx, clients/CONTRACT.md "Statements of 1.3"), in process: a pool of client connections
that PgBouncer hands server connections transaction by transaction.

- many requests at once on a pool of 6 connections: no 5xx, and every key executed once (one ledger row, one first
  201, every other answer a replay or a 409 while it is held);
- a client connection's second transaction put on another server connection: the claim fails with 26000 before
  the handler ran, the same request runs again unnamed (201, the handler once), and preparing is off after it.
"""

import os
import sys
import threading
import uuid

import psycopg
import pytest

import harness
from client import parallel
from conftest import selected_langs

sys.path.insert(0, os.path.join(harness.CLIENTS, "python", "src"))
sys.path.insert(0, os.path.join(harness.CLIENTS, "python", "tests"))

pytestmark = pytest.mark.skipif("python" not in selected_langs(), reason="E2E_LANGS leaves out python")

POOL = 6
THREADS = 8
PER_THREAD = 40
HOT_KEYS = 6


def _app(pool, calls):
    from payments_service.app import PaymentsApp

    app = PaymentsApp(pool)
    inner = app.protected.app

    def counted(environ, start_response):
        key = environ["HTTP_IDEMPOTENCY_KEY"]
        with calls["lock"]:
            calls[key] = calls.get(key, 0) + 1
        return inner(environ, start_response)

    app.protected.app = counted
    return app


def _pay(app, account, key):
    from wsgi_client import request

    return request(app, "POST", "/payments", {"amount_cents": 100, "currency": "EUR"},
                   {"Authorization": "Bearer " + account, "Idempotency-Key": key})


def _account():
    return "pooled_" + uuid.uuid4().hex[:12]


def test_a_pool_of_connections_through_pgbouncer_gets_no_500_and_runs_each_key_once(stack, db):
    from idempotency_pg import connection_pool

    account, calls = _account(), {"lock": threading.Lock()}
    hot = [f"hot-{uuid.uuid4().hex}" for _ in range(HOT_KEYS)]
    answers = []
    with connection_pool(harness.BOUNCER_URL, min_size=POOL, max_size=POOL, timeout=30) as pool:
        pool.wait(timeout=30)
        app = _app(pool, calls)

        def worker(i):
            for n in range(PER_THREAD):
                key = hot[(i + n) % HOT_KEYS] if n % 2 else f"fresh-{uuid.uuid4().hex}"
                r = _pay(app, account, key)
                with calls["lock"]:
                    answers.append((key, r.status, r.header("Idempotent-Replayed") == "true", r.body))

        # The first requests of every connection at once (parallel releases the threads together).
        errors = parallel(THREADS, worker)
        preparing = app.protected.preparing.on
    print(f"\n[pooled] {len(answers)} requests, preparing {'on' if preparing else 'off'} after them", flush=True)
    assert not errors, errors[:3]
    bad = [a for a in answers if a[1] not in (201, 409)]
    assert not bad, f"{len(bad)} answers not 201/409: {bad[:3]}"
    first = {}
    for key, status, replayed, _ in answers:
        if status == 201 and not replayed:
            first[key] = first.get(key, 0) + 1
    keys = {a[0] for a in answers}
    assert set(first) == keys - {k for k in hot if k not in first}, "a key never got its first 201"
    assert all(n == 1 for n in first.values()), {k: n for k, n in first.items() if n != 1}
    ran = {k: n for k, n in calls.items() if k != "lock"}
    assert ran == {k: 1 for k in first}, {k: n for k, n in ran.items() if n != 1}
    rows = db.execute("SELECT idempotency_key, count(*) FROM ledger WHERE account = %s GROUP BY 1",
                      (account,)).fetchall()
    assert dict(rows) == {k: 1 for k in first}


def test_another_server_connection_is_found_at_the_claim_before_the_handler(stack, db):
    """The client connection's first request prepares both statements on server connection S; then S is held by
    another client's open transaction, so the second request lands elsewhere: 26000 at the claim's Bind, the
    handler has not run, the request runs again unnamed and is executed once."""
    from idempotency_pg import connect_kwargs
    from wsgi_client import OneConnection

    account, calls, pids = _account(), {"lock": threading.Lock()}, []
    holders = []
    with psycopg.connect(harness.BOUNCER_URL, **connect_kwargs()) as conn:
        app = _app(OneConnection(conn), calls)
        inner = app.protected.app

        def with_pid(environ, start_response):
            pids.append(environ["idempotency_pg.connection"].execute("SELECT pg_backend_pid()").fetchone()[0])
            return inner(environ, start_response)

        app.protected.app = with_pid
        assert _pay(app, account, "s1").status == 201 and app.protected.preparing.on
        try:
            for _ in range(40):  # PgBouncer hands out idle server connections first: S comes within a few
                h = psycopg.connect(harness.BOUNCER_URL, **connect_kwargs())
                holders.append(h)
                h.execute("BEGIN")
                if h.execute("SELECT pg_backend_pid()").fetchone()[0] == pids[0]:
                    break
            else:
                pytest.fail("no client got the server connection of the first request")
            r = _pay(app, account, "s2")
            assert r.status == 201 and r.header("Idempotent-Replayed") is None, r
            assert pids[1] != pids[0]
            assert not app.protected.preparing.on
            assert {k: n for k, n in calls.items() if k != "lock"} == {"s1": 1, "s2": 1}
        finally:
            for h in holders:
                h.close()
    assert db.execute("SELECT count(*) FROM ledger WHERE account = %s", (account,)).fetchone()[0] == 2
