"""Against a real database (IDEM_TEST_DATABASE_URL): claim, replay, mismatch, 5xx and errors not cached, retries."""

import hashlib
import time

import psycopg
import pytest

from idempotency_pg import ATTEMPT, CONNECTION, IdempotencyMiddleware, json_response, run_wsgi
from payments_service import PaymentsApp, account_scope

from conftest import needs_db, traced_round_trips
from wsgi_client import OneConnection, body_json, environ_of

pytestmark = needs_db

PAY = {"amount_cents": 1250, "currency": "EUR"}


@pytest.fixture
def app(pool):
    return PaymentsApp(pool, faults=True)


def pay_environ(account, key, body=PAY, fault=None, path="/payments"):
    headers = {"Authorization": "Bearer " + account}
    if key is not None:
        headers["Idempotency-Key"] = key
    if fault:
        headers["X-Fault"] = fault
    return environ_of("POST", path, body, headers)


def pay(app, account, key, body=PAY, fault=None, path="/payments"):
    return run_wsgi(app, pay_environ(account, key, body, fault, path))


def ledger(db, account):
    return db.execute("SELECT id, amount_cents, currency, idempotency_key FROM ledger WHERE account = %s ORDER BY id",
                      (account,)).fetchall()


def stored_outcome(db, account, key):
    """What another session's claim of (key, account) answers: "claimed" means nothing is stored or held."""
    with db.transaction() as tx:
        outcome = db.execute("SELECT outcome FROM idem_claim(%s, idem_hash('x'::text), NULL, %s)",
                             (key, account)).fetchone()[0]
        raise psycopg.Rollback(tx)
    return outcome


def test_claim_then_replay(app, db, account):
    first = pay(app, account, '"order-1"')
    assert first.status == 201
    b = body_json(first)
    assert b == {"payment_id": b["payment_id"], "account": account, "amount_cents": 1250, "currency": "EUR"}
    assert first.header("Location") == "/payments/%d" % b["payment_id"]
    assert first.header("Content-Type") == "application/json"
    assert first.header("Idempotent-Replayed") is None

    # the bare form is the same key; key order and spacing of the body do not change the fingerprint
    again = pay(app, account, "order-1", b'{ "currency" : "EUR",\n "amount_cents": 1250 }')
    assert again.status == 201
    assert body_json(again) == b
    assert again.header("Location") == first.header("Location")
    assert again.header("Content-Type") == "application/json"
    assert again.header("Idempotent-Replayed") == "true"

    assert ledger(db, account) == [(b["payment_id"], -1250, "EUR", "order-1")]


def test_scope_is_the_account(app, db, account):
    other = account + "_b"
    assert pay(app, account, "shared").status == 201
    r = pay(app, other, "shared")
    assert r.status == 201 and r.header("Idempotent-Replayed") is None
    assert len(ledger(db, account)) == 1 and len(ledger(db, other)) == 1


def test_validation_422_is_not_executed(app, db, account):
    """Body validation answers "not executed": not stored, the key released for the corrected retry."""
    bad = {"amount_cents": 0, "currency": "EUR"}
    r1 = pay(app, account, "v", bad)
    assert r1.status == 422
    assert r1.header("Content-Type") == "application/problem+json"
    assert stored_outcome(db, account, "v") == "claimed"  # nothing stored, nothing held
    r2 = pay(app, account, "v", bad)
    assert r2.status == 422 and r2.header("Idempotent-Replayed") is None
    ok = pay(app, account, "v")
    assert ok.status == 201 and ok.header("Idempotent-Replayed") is None
    assert len(ledger(db, account)) == 1


@pytest.mark.parametrize("body", [
    {"amount_cents": -5, "currency": "EUR"}, {"amount_cents": 1.5, "currency": "EUR"},
    {"amount_cents": "5", "currency": "EUR"}, {"amount_cents": True, "currency": "EUR"},
    {"amount_cents": 5, "currency": "eur"}, {"amount_cents": 5, "currency": "EURO"}, {"amount_cents": 5},
    {"amount_cents": 2 ** 63, "currency": "EUR"}, [1, 2], b'"x"', b"null",
])
def test_invalid_payments_are_422(app, db, account, body):
    r = pay(app, account, "bad-" + hashlib.sha1(repr(body).encode()).hexdigest(), body)
    assert r.status == 422


@pytest.mark.parametrize("fault,status,detail", [
    ("503", 503, "upstream unavailable"),
    ("db-error", 500, "database error (SQLSTATE 22012); the request was rolled back"),
])
def test_5xx_is_not_cached_and_rolls_back(app, db, account, fault, status, detail):
    r = pay(app, account, "f", fault=fault)
    assert (r.status, r.header("Content-Type"), body_json(r)["detail"]) == (status, "application/problem+json", detail)
    assert ledger(db, account) == []
    assert stored_outcome(db, account, "f") == "claimed"  # nothing stored: the key is free
    ok = pay(app, account, "f")
    assert ok.status == 201 and ok.header("Idempotent-Replayed") is None
    assert pay(app, account, "f").header("Idempotent-Replayed") == "true"
    assert len(ledger(db, account)) == 1


def test_in_progress_is_409_at_once(app, database_url, db, account):
    with psycopg.connect(database_url, autocommit=True) as holder:
        with holder.transaction() as tx:
            assert holder.execute("SELECT outcome FROM idem_claim('held', idem_hash('x'::text), NULL, %s)",
                                  (account,)).fetchone()[0] == "claimed"
            t = time.monotonic()
            r = pay(app, account, "held")
            elapsed = time.monotonic() - t
            assert r.status == 409
            assert r.header("Retry-After") == "1"
            assert body_json(r)["status"] == 409
            assert elapsed < 2.0  # the holder holds the key until the test rolls back: a waiting claim never returns
            raise psycopg.Rollback(tx)
    assert pay(app, account, "held").status == 201  # the holder rolled back: the key is free
    assert len(ledger(db, account)) == 1


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_serialization_failure_reruns_the_transaction(pool, db, account, sqlstate):
    attempts = []

    def handler(environ, start_response):
        conn = environ[CONNECTION]
        attempts.append(environ[ATTEMPT])
        conn.execute("INSERT INTO ledger (account, amount_cents, currency, idempotency_key) "
                     "VALUES (%s, -1, 'EUR', 'r')", (account,))
        if environ[ATTEMPT] < 2:
            conn.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '%s'; END $$" % sqlstate)
        resp = json_response(201, {"attempt": environ[ATTEMPT]})
        start_response(resp.status_line(), resp.headers)
        return [resp.body]

    mw = IdempotencyMiddleware(handler, pool, scope=account_scope)
    r = pay(mw, account, "r")
    assert (r.status, body_json(r)) == (201, {"attempt": 2})
    assert attempts == [0, 1, 2]
    assert len(ledger(db, account)) == 1  # the failed attempts were rolled back
    assert body_json(pay(mw, account, "r")) == {"attempt": 2}


def test_serialization_failure_gives_up_after_3_retries(pool, db, account):
    attempts = []

    def handler(environ, start_response):
        attempts.append(environ[ATTEMPT])
        environ[CONNECTION].execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")

    mw = IdempotencyMiddleware(handler, pool, scope=account_scope)
    r = pay(mw, account, "never")
    assert r.status == 409 and r.header("Retry-After") == "1"
    assert attempts == [0, 1, 2, 3]
    assert stored_outcome(db, account, "never") == "claimed"


def test_unprotected(app, db, account):
    r = pay(app, account, None, path="/payments-unprotected")
    assert r.status == 201
    r2 = pay(app, account, None, path="/payments-unprotected")
    assert r2.status == 201 and body_json(r2)["payment_id"] != body_json(r)["payment_id"]
    assert pay(app, account, None, fault="503", path="/payments-unprotected").status == 503
    assert pay(app, account, None, fault="db-error", path="/payments-unprotected").status == 500
    assert len(ledger(db, account)) == 2


def test_faults_are_off_unless_enabled(pool, db, account):
    r = pay(PaymentsApp(pool, faults=False), account, "nf", fault="503")
    assert r.status == 201


def test_round_trips_prepared_statements_and_the_replay_answered_before_its_rollback(database_url, account, tmp_path):
    """A claimed request is 3 round trips (BEGIN + claim, the handler's INSERT, completion + COMMIT), a replay 2 of
    which the client waits for one: it is answered while the transaction is still open.  The claim and the
    completion are prepared once and bound after (ROLLBACKs included); the handler's statements are not prepared."""
    from psycopg.pq import Trace, TransactionStatus

    trace = tmp_path / "trace"
    with psycopg.connect(database_url, autocommit=True) as conn, open(trace, "w") as f:
        app, seen = PaymentsApp(OneConnection(conn), faults=True), []
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        assert pay(app, account, "rt").status == 201
        environ = dict(pay_environ(account, "rt"))
        replay = app.protected.handle(environ, lambda r: seen.append((r.status, conn.info.transaction_status)))
        assert replay is None and seen == [(201, TransactionStatus.INTRANS)]
        assert pay(app, account, "rt", fault="503").header("Idempotent-Replayed") == "true"
        assert pay(app, account, "rt2", fault="503").status == 503  # rolled back
        assert pay(app, account, "rt2").status == 201
        conn.pgconn.untrace()
        prepared = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements ORDER BY prepare_time")]
    trips = traced_round_trips(trace)
    assert trips[:5] == ["BEGIN; idem_claim_request", trips[1], "idem_complete_request; COMMIT",
                         "BEGIN; idem_claim_request", "ROLLBACK"], trips
    assert trips[1].startswith("INSERT INTO ledger")
    assert [p.split("(")[0] for p in prepared] == ["SELECT idem_claim_request", "SELECT idem_complete_request"]


def test_a_pooler_that_loses_prepared_statements_turns_them_off(database_url, db, account):
    """The server connection forgets the prepared statements behind psycopg's back (as when PgBouncer in
    transaction pooling hands the client another one): the request runs again unprepared and succeeds."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        app = PaymentsApp(OneConnection(conn))
        assert pay(app, account, "pb1").status == 201 and app.protected.preparing.on
        conn.pgconn.exec_(b"DEALLOCATE ALL")
        r = pay(app, account, "pb2")
        assert r.status == 201 and r.header("Idempotent-Replayed") is None, r
        assert not app.protected.preparing.on
        assert pay(app, account, "pb2").header("Idempotent-Replayed") == "true"
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
    assert len(ledger(db, account)) == 2


def test_named_statements_are_unique_to_the_client_connection(database_url):
    """Two client connections name their statements apart (behind a pooler they may share a server connection),
    and each name says its text: never psycopg's _pg3_N, which every connection uses."""
    from idempotency_pg.core import named_of

    with psycopg.connect(database_url, autocommit=True) as a, psycopg.connect(database_url, autocommit=True) as b:
        na, nb = named_of(a), named_of(b)
        assert named_of(a) is na
        assert {na.claim, na.complete}.isdisjoint({nb.claim, nb.complete}) and na.claim != na.complete
        assert na.claim.split(b"_")[1] == nb.claim.split(b"_")[1]  # the same text, the same hash part
        assert all(len(n) < 64 and not n.startswith(b"_pg3_") for n in (na.claim, na.complete))


def test_a_lost_statement_after_the_handler_ran_is_500_and_never_run_again(database_url, db, account):
    """The handler deallocates the statements (as a pooler would lose them): the completion's Bind fails with 26000
    after the handler ran, so the request is rolled back and answered 500, the handler is not run again, and the
    next requests go unnamed."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        calls = []

        def handler(environ, start_response):
            calls.append(environ[CONNECTION])
            environ[CONNECTION].pgconn.exec_(b"DEALLOCATE ALL")
            start_response("201 Created", [("Content-Type", "application/json")])
            return [b"{}"]

        mw = IdempotencyMiddleware(handler, OneConnection(conn), scope=account_scope, methods=("POST",))
        r = run_wsgi(mw, pay_environ(account, "lost"))
        assert r.status == 500 and b"26000" in r.body, r
        assert len(calls) == 1 and not mw.preparing.on
        assert stored_outcome(db, account, "lost") == "claimed"  # nothing kept: the retry is a fresh request
        r = run_wsgi(mw, pay_environ(account, "lost"))
        assert r.status == 201 and len(calls) == 2
