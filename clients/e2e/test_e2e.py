"""The article's payment story over real HTTP on loopback, for every service (go, node, python) both straight
to PostgreSQL and through PgBouncer in transaction pooling mode (clients/CONTRACT.md)."""

import json
import os
import socket
import threading
import time
import uuid

import pytest

import harness
from client import Client, body_of, new_key, raw_exchange
from conftest import get_service, selected_langs

PARAMS = [(l, m) for l in selected_langs() for m in harness.MODES]


@pytest.fixture(scope="session", params=PARAMS, ids=[f"{l}-{m}" for l, m in PARAMS])
def service(request, stack, _service_registry):
    lang, mode = request.param
    return get_service(_service_registry, stack, lang, mode)


_accounts = {}


@pytest.fixture(scope="session")
def account(service):
    """One account (the idempotency scope) per service and mode and run, so runs never share keys. The same one
    again when the service's last checks (conftest.RUN_LAST) come round after the other services' checks."""
    return _accounts.setdefault(service.name, f"e2e_{service.lang}_{service.mode}_{uuid.uuid4().hex[:8]}"
                                .replace("-", "_"))  # [a-z0-9_]{1,64}


@pytest.fixture
def client(service, account):
    c = Client(service.base, account)
    yield c
    c.close()


rule = pytest.mark.rule  # the CONTRACT.md rule a check checks (harness.NOT_APPLICABLE names exceptions)


def debits(db, account, key):
    return db.execute("SELECT id, amount_cents, currency FROM ledger WHERE account = %s AND idempotency_key = %s "
                      "ORDER BY id", (account, key)).fetchall()


def stored(db, account, key):
    return db.execute("SELECT http_status FROM idempotency_keys WHERE scope = %s AND key = %s "
                      "UNION ALL SELECT http_status FROM idempotency_keys_partitioned WHERE scope = %s AND key = %s",
                      (account, key, account, key)).fetchall()


def assert_problem(r, status, type_suffix=None):
    assert r.status == status, r
    assert r.content_type == "application/problem+json", r
    p = r.json
    assert p.get("status") == status, r
    assert isinstance(p.get("title"), str) and p["title"], r
    assert "type" in p and "detail" in p, r
    if type_suffix:
        assert str(p["type"]).endswith(type_suffix), r
    return p


def assert_created(r, account, amount=100, currency="EUR", replayed=False):
    assert r.status == 201, r
    assert r.content_type == "application/json", r
    b = r.json
    assert b["account"] == account and b["amount_cents"] == amount and b["currency"] == currency, r
    assert isinstance(b["payment_id"], int), r
    assert r.header("Location") == f"/payments/{b['payment_id']}", r
    assert r.replayed == replayed, r
    return b


# --------------------------------------------------------------------------- the process

def test_healthz(service):
    r = Client(service.base).request("GET", "/healthz")
    assert r.status == 200 and r.json == {"ok": True}, r


# --------------------------------------------------------------------------- the story

def test_retry_replays_same_response(client, db, account):
    key = new_key()
    first = client.pay(key)
    b1 = assert_created(first, account)
    second = client.pay(key)
    b2 = assert_created(second, account, replayed=True)
    assert second.body and b2 == b1, (first, second)
    assert second.header("Location") == first.header("Location")
    assert first.header("Idempotent-Replayed") is None, first
    assert [row[0] for row in debits(db, account, key)] == [b1["payment_id"]]
    assert debits(db, account, key)[0][1:] == (-100, "EUR")


def test_lost_response_retry_replays(service, client, db, account):
    """The server commits the debit, the response never reaches the client, the client retries."""
    key = new_key()
    body = body_of(100)
    req = (f"POST /payments HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\nAuthorization: Bearer {account}\r\n"
           f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
           f"Connection: close\r\n\r\n").encode() + body
    s = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    try:
        s.sendall(req)
        deadline = time.time() + 10
        while time.time() < deadline and not debits(db, account, key):
            time.sleep(0.01)
    finally:
        s.close()  # the response is lost: never read
    rows = debits(db, account, key)
    assert len(rows) == 1, f"the first request never committed its debit: {rows}"
    r = client.pay(key)
    b = assert_created(r, account, replayed=True)
    assert b["payment_id"] == rows[0][0]
    assert len(debits(db, account, key)) == 1


def _is_sleeping(db):
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                      "pid <> pg_backend_pid() AND state = 'active' AND query ILIKE '%pg_sleep%'").fetchone()[0] > 0


def test_parallel_clicks(service, client, db, account):
    """Five clicks with one key: the first (held 2 s in its handler) gets 201, the four others 409 at once.

    "At once" is judged against the hold, with a margin for a machine whose cores are busy: a 409 that waited for
    the holder would take 2 s; each must come back within 1 s (a quiet machine answers in milliseconds)."""
    parallel_clicks(service, client, db, account)


def parallel_clicks(service, client, db, account):
    key = new_key()
    results = {}

    def click(i, fault=None):
        c = Client(service.base, account)
        results[i] = c.pay(key, fault=fault)

    # The holder sleeps 4 s and a 409 must come within 2 s: a service that waited for the holder's lock would
    # answer after 3.5 s or more, and a 409 answered at once keeps a 2x margin over the slowest seen on a loaded
    # machine (1.1 s at load average 17).
    first = threading.Thread(target=click, args=(0, "sleep=4000"))
    first.start()
    deadline = time.time() + 3.0  # until its handler sleeps, with the key claimed
    while time.time() < deadline and not _is_sleeping(db):
        time.sleep(0.005)
    barrier = threading.Barrier(4)

    def other(i):
        barrier.wait()
        click(i)

    others = [threading.Thread(target=other, args=(i,)) for i in range(1, 5)]
    for t in others:
        t.start()
    for t in others + [first]:
        t.join(timeout=15)
    assert len(results) == 5, results
    assert_created(results[0], account)
    for i in range(1, 5):
        r = results[i]
        assert_problem(r, 409)
        assert r.header("Retry-After") == "1", r
        assert r.elapsed < 2.0, f"409 took {r.elapsed * 1000:.0f} ms, the holder holds 4000 ms: {r}"
    assert sum(1 for r in results.values() if r.status == 201) == 1
    assert len(debits(db, account, key)) == 1
    again = client.pay(key)
    assert assert_created(again, account, replayed=True) == results[0].json


def test_tampered_amount_is_422(client, db, account):
    key = new_key()
    assert_created(client.pay(key, amount=100), account)
    r = client.pay(key, amount=10000)
    assert_problem(r, 422, "idempotency-key-reused")
    assert [row[1] for row in debits(db, account, key)] == [-100]


def test_db_error_then_retry_succeeds(client, db, account):
    key = new_key()
    r = client.pay(key, fault="db-error")
    assert_problem(r, 500)
    assert debits(db, account, key) == [], "the debit of the failed transaction was not rolled back"
    assert stored(db, account, key) == []
    r = client.pay(key)
    assert_created(r, account, replayed=False)
    assert len(debits(db, account, key)) == 1


def test_503_is_not_cached(client, db, account):
    key = new_key()
    r = client.pay(key, fault="503")
    assert_problem(r, 503)
    assert debits(db, account, key) == []
    assert stored(db, account, key) == []
    r = client.pay(key)
    assert_created(r, account, replayed=False)
    assert len(debits(db, account, key)) == 1
    assert stored(db, account, key) == [(201,)]


@pytest.mark.parametrize("first,then", [('"{}"', "{}"), ("{}", '"{}"')], ids=["quoted-then-bare", "bare-then-quoted"])
def test_quoted_and_bare_key_are_the_same(client, db, account, first, then):
    key = new_key()
    b1 = assert_created(client.pay(first.format(key)), account)
    assert assert_created(client.pay(then.format(key)), account, replayed=True) == b1
    assert len(debits(db, account, key)) == 1


def test_quoted_key_with_escapes(client, db, account):
    raw = new_key() + '"q\\z'  # the key itself holds a quote and a backslash
    header = '"' + raw.replace("\\", "\\\\").replace('"', '\\"') + '"'
    b1 = assert_created(client.pay(header), account)
    assert assert_created(client.pay(header), account, replayed=True) == b1
    assert len(debits(db, account, raw)) == 1, "the key was not unescaped to its sf-string value"


def test_missing_key_is_400(client, db, account):
    before = db.execute("SELECT count(*) FROM ledger WHERE account = %s", (account,)).fetchone()[0]
    r = client.pay(None)
    assert_problem(r, 400, "idempotency-key-missing")
    after = db.execute("SELECT count(*) FROM ledger WHERE account = %s", (account,)).fetchone()[0]
    assert after == before


BAD_KEYS = {
    "empty": "",
    "empty-quoted": '""',
    "unterminated": '"abc',
    "bad-escape": '"a\\qb"',
    "trailing-garbage": '"abc"x',
    "inner-space": "ab cd",
    "control-char": '"a\tb"',  # a tab: legal in an HTTP field, a control character in the key
    "too-long": "k" * 256,
}


@pytest.mark.parametrize("bad", list(BAD_KEYS.values()), ids=list(BAD_KEYS))
def test_bad_key_is_400(client, db, account, bad):
    before = db.execute("SELECT count(*) FROM ledger WHERE account = %s", (account,)).fetchone()[0]
    r = client.pay(bad)
    assert_problem(r, 400, "idempotency-key-invalid")
    after = db.execute("SELECT count(*) FROM ledger WHERE account = %s", (account,)).fetchone()[0]
    assert after == before


def test_key_of_255_bytes_is_valid(client, db, account):
    key = "k" + uuid.uuid4().hex + "x" * (255 - 33)
    assert len(key.encode()) == 255
    assert_created(client.pay(key), account)
    assert_created(client.pay(key), account, replayed=True)
    assert len(debits(db, account, key)) == 1


# --------------------------------------------------------------------------- the rest of the contract

def test_missing_or_malformed_bearer_is_401(client, db):
    key = new_key()
    assert_problem(client.pay(key, auth=False), 401)
    assert_problem(client.pay(key, headers={"Authorization": "Bearer Not-Valid!"}), 401)
    assert_problem(client.pay(key, headers={"Authorization": "Basic YWxpY2U6eA=="}), 401)
    assert db.execute("SELECT count(*) FROM ledger WHERE idempotency_key = %s", (key,)).fetchone()[0] == 0


def test_scope_is_the_account(client, db, account):
    key = new_key()
    other = account + "_b"
    b1 = assert_created(client.pay(key), account)
    b2 = assert_created(client.pay(key, account=other), other)
    assert b1["payment_id"] != b2["payment_id"]
    assert len(debits(db, account, key)) == 1 and len(debits(db, other, key)) == 1


def test_not_json_is_400_and_key_not_consumed(client, db, account):
    key = new_key()
    r = client.pay(key, body=b"amount=100")
    assert r.status == 400 and r.content_type == "application/problem+json", r
    assert debits(db, account, key) == [] and stored(db, account, key) == []
    assert_created(client.pay(key), account, replayed=False)


# (the answer to every kind of invalid body: CORPUS below)
INVALID_BODIES = {"zero": {"amount_cents": 0, "currency": "EUR"}, "lowercase-currency": {"amount_cents": 100, "currency": "eur"}}


def test_key_order_and_whitespace_do_not_change_the_fingerprint(client, db, account):
    key = new_key()
    b1 = assert_created(client.pay(key, body=b'{"amount_cents":100,"currency":"EUR"}'), account)
    r = client.pay(key, body=b'{ "currency" : "EUR",\n  "amount_cents" : 100 }')
    assert assert_created(r, account, replayed=True) == b1


def test_unprotected_endpoint(client, db, account):
    acct = account + "_u"  # its own account: the ledger rows it writes carry no idempotency key of ours
    r = client.pay(None, path="/payments-unprotected", account=acct)
    assert r.status == 201, r
    b = r.json
    assert b["account"] == acct and b["amount_cents"] == 100
    row = db.execute("SELECT account, amount_cents FROM ledger WHERE id = %s", (b["payment_id"],)).fetchone()
    assert row == (acct, -100)


# --------------------------------------------------------------------------- the rules of CONTRACT.md

@rule("framework-errors")
def test_framework_error_after_write_422_is_stored_as_sent(service, client, db, account):
    key = new_key()
    r = client.pay(key, fault="throw-422")
    assert_problem(r, 422)  # the handler raised its framework's 422 after the insert
    assert len(debits(db, account, key)) == 1, "a 4xx is committed with what was sent"
    assert stored(db, account, key) == [(422,)]
    again = client.pay(key)
    assert again.status == 422 and again.replayed and again.body == r.body, (r, again)


@rule("framework-errors")
def test_framework_error_after_write_502_rolls_back(service, client, db, account):
    key = new_key()
    r = client.pay(key, fault="throw-502")
    assert_problem(r, 502)  # the handler raised its framework's 502 after the insert
    assert debits(db, account, key) == [], "the debit of a 5xx answer was committed"
    assert stored(db, account, key) == []
    assert_created(client.pay(key), account, replayed=False)


SEVERAL_KEYS = {"comma": "{a},{b}", "comma-space": "{a}, {b}", "quoted": '"{a}", "{b}"', "two-lines": None}


@rule("several-keys")
@pytest.mark.parametrize("form", list(SEVERAL_KEYS), ids=list(SEVERAL_KEYS))
def test_several_keys_are_400(service, client, db, account, form):
    a, b = new_key("a"), new_key("b")
    if SEVERAL_KEYS[form] is None:  # two header lines, which HTTP joins with a comma
        head = (f"POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {account}\r\n"
                f"Idempotency-Key: {a}\r\nIdempotency-Key: {b}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body_of())}\r\nConnection: close\r\n")
        r, _ = raw_exchange(service.port, head, body_of())
    else:
        r = client.pay(SEVERAL_KEYS[form].format(a=a, b=b))
    assert_problem(r, 400, "idempotency-key-invalid")
    assert debits(db, account, a) == [] and debits(db, account, b) == []
    assert_created(client.pay(a), account, replayed=False)  # neither key was consumed


@rule("several-keys")
def test_comma_inside_a_quoted_key_is_one_key(service, client, db, account):
    raw = new_key() + ",x"
    b1 = assert_created(client.pay(f'"{raw}"'), account)
    assert assert_created(client.pay(f'"{raw}"'), account, replayed=True) == b1
    assert len(debits(db, account, raw)) == 1


LIMIT = 1048576


def _post_raw(service, account, key, body):
    return raw_exchange(service.port, _head(account, key, f"Content-Length: {len(body)}"), body)[0]


def _padded(size):
    """A valid payment body of exactly ``size`` bytes (JSON padded with spaces)."""
    core = body_of()
    return core[:-1] + b" " * (size - len(core)) + b"}"


ANSWER_WITHIN = 10.0  # an early answer takes milliseconds; a service reading a body never sent waits forever


def _head(account, key, length_line, close=True):
    return (f"POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {account}\r\n"
            f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\n{length_line}\r\n"
            + ("Connection: close\r\n" if close else ""))


BEFORE_READING = {"content-length": ("Content-Length: 10485760", b""),  # 10 MiB announced, no byte of it sent
                  "chunked": ("Transfer-Encoding: chunked",  # one byte over the limit, and no end of the body
                              f"{LIMIT + 1:x}\r\n".encode() + b" " * (LIMIT + 1) + b"\r\n")}


@rule("body-limit")
@pytest.mark.parametrize("form", list(BEFORE_READING))
def test_413_before_reading_and_key_not_consumed(service, client, db, account, form):
    """413 for a Content-Length over the limit without waiting for the body, and for a chunked body as soon as it
    passes the limit: the rest of the body is never sent, so a service that reads on before answering times out.
    The connection is a keep-alive one: the service must close it itself rather than read the rest first."""
    key = new_key()
    length, body = BEFORE_READING[form]
    r, _ = raw_exchange(service.port, _head(account, key, length, close=False), body, timeout=ANSWER_WITHIN)
    assert_problem(r, 413, "request-too-large")
    assert debits(db, account, key) == [] and stored(db, account, key) == []
    assert_created(client.pay(key), account, replayed=False)


@rule("whole-body")
def test_truncated_body_is_not_executed(service, client, db, account):
    """The client hangs up after 37 of the 600 bytes its Content-Length announced; the 37 bytes are a whole
    payment. Not executed: no debit, nothing stored, and the proper retry with the key is claimed afresh."""
    key = new_key()
    whole = _padded(600)
    raw_exchange(service.port, _head(account, key, "Content-Length: 600"), b'{"amount_cents":100,"currency":"EUR"}',
                 timeout=ANSWER_WITHIN, hang_up=True)  # whatever the answer, if any
    assert debits(db, account, key) == [] and stored(db, account, key) == []
    assert_created(client.pay(key, body=whole), account, replayed=False)
    assert len(debits(db, account, key)) == 1


@rule("body-limit")
def test_body_limit_is_1_mib_exactly(service, client, db, account):
    key = new_key()
    assert_problem(_post_raw(service, account, key, _padded(LIMIT + 1)), 413, "request-too-large")
    assert debits(db, account, key) == []
    assert_created(_post_raw(service, account, key, _padded(LIMIT)), account)
    assert len(debits(db, account, key)) == 1


@rule("not-executed")
@pytest.mark.parametrize("body", list(INVALID_BODIES.values()), ids=list(INVALID_BODIES))
def test_invalid_body_is_not_executed(service, client, db, account, body):
    """Validation before any write: answered 422, not stored, the key released for the corrected retry."""
    key = new_key()
    raw = json.dumps(body).encode()
    r = client.pay(key, body=raw)
    assert_problem(r, 422, "invalid-payment")
    assert not r.replayed
    assert stored(db, account, key) == [], "a not-executed answer was stored"
    again = client.pay(key, body=raw)
    assert_problem(again, 422, "invalid-payment")
    assert not again.replayed, f"a not-executed answer was replayed: {again}"
    fixed = client.pay(key, body=body_of(100, "EUR"))
    assert_created(fixed, account, replayed=False)
    assert len(debits(db, account, key)) == 1
    assert stored(db, account, key) == [(201,)]


@rule("byte-identical-replay")
def test_replay_is_byte_identical(service, client, db, account):
    key = new_key()
    first = client.pay(key, body=b'{"currency":"EUR","amount_cents":4321}')
    assert first.status == 201, first
    for _ in range(2):
        again = client.pay(key, body=b'{"amount_cents": 4321, "currency": "EUR"}')
        assert again.status == 201 and again.replayed, again
        assert again.body == first.body, f"replay not byte-identical:\n{first.body!r}\n{again.body!r}"
        for h in ("Content-Type", "Location"):
            assert again.header(h) == first.header(h), (h, first, again)


@pytest.mark.parametrize("method,path,allow", [("GET", "/payments", "POST"), ("PUT", "/payments", "POST"),
                                               ("DELETE", "/payments", "POST"),
                                               ("GET", "/payments-unprotected", "POST"),
                                               ("POST", "/healthz", "GET, HEAD")])
@rule("method-not-allowed")
def test_wrong_method_is_405_with_allow(service, method, path, allow, account):
    r = Client(service.base, account).request(method, path, headers={"Authorization": f"Bearer {account}"})
    assert_problem(r, 405)
    got = {m.strip().upper() for m in (r.header("Allow") or "").split(",") if m.strip()}
    assert got == {m.strip() for m in allow.split(",")}, r


@rule("method-not-allowed")
def test_unknown_path_is_404(service, account):
    assert_problem(Client(service.base, account).request("GET", "/no-such-path"), 404)


IDLE_SECONDS = float(os.environ.get("E2E_IDLE_SECONDS", "12"))


@pytest.fixture(scope="session")
def idle_spell():
    """IDLE_SECONDS (longer than node-postgres' default 10 s idle timeout) without a request to any service.
    The tests that use it run after every other check of every service (conftest.RUN_LAST), and each touches only
    its own service: so every service has been idle for at least IDLE_SECONDS when its turn comes."""
    time.sleep(IDLE_SECONDS)


@rule("idle-409")
def test_409_at_once_after_an_idle_spell(service, idle_spell, client, db, account):
    parallel_clicks(service, client, db, account)


# --------------------------------------------------------------------------- lease mode: POST /rides

def ride(service, account, key, fault=None, amount=2000, timeout=15.0):
    """POST /rides on the service's current port (a crash test restarts it, maybe on another port)."""
    return Client(service.base, account, timeout=timeout).pay(key, amount=amount, fault=fault, path="/rides")


def rides_of(db, account, key):
    return db.execute("SELECT id, charge_id, receipt_sent FROM rides WHERE account = %s AND idempotency_key = %s",
                      (account, key)).fetchall()


def charges_of(db, account, key):
    return db.execute("SELECT charge_id FROM provider_charges WHERE account = %s AND idempotency_key = %s",
                      (account, key)).fetchall()


def assert_ride(r, account, replayed=False):
    assert r.status == 201, r
    b = r.json
    assert b["account"] == account and b["amount_cents"] == 2000 and b["charge_id"].startswith("ch_"), r
    assert r.header("Location") == f"/rides/{b['ride_id']}", r
    assert r.replayed == replayed, r
    return b


@rule("lease-rides")
def test_ride_runs_through_and_replays_byte_identical(service, client, db, account):
    key = new_key()
    first = ride(service, account, key)
    b = assert_ride(first, account)
    again = ride(service, account, key)
    assert_ride(again, account, replayed=True)
    assert again.body == first.body
    assert rides_of(db, account, key) == [(b["ride_id"], b["charge_id"], True)]
    assert charges_of(db, account, key) == [(b["charge_id"],)]


@rule("lease-rides")
def test_ride_invalid_body_is_not_executed(service, client, db, account):
    key = new_key()
    assert_problem(ride(service, account, key, amount=0), 422, "invalid-payment")
    assert charges_of(db, account, key) == []
    assert_ride(ride(service, account, key), account)


def _crash_and_resume(service, client, db, account, fault):
    key = new_key()
    try:
        r = ride(service, account, key, fault=fault, timeout=10)
        raise AssertionError(f"the service answered instead of crashing: {r}")
    except (ConnectionError, OSError, http_client_errors()):
        pass
    deadline = time.time() + 10
    while service.proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert service.proc.poll() is not None, "the service did not exit on " + fault
    service.stop()
    service.start()
    wait_lease_lapsed(db, account, key)  # the dead holder's lease runs out
    return key


def wait_lease_lapsed(db, account, key):
    """Polls until the lease on the key has run out by the database's clock (the clock the extension judges a
    lease by), instead of sleeping a lease and a margin; fails if it has not after twice the lease."""
    deadline = time.time() + 2 * harness.RIDES_LEASE_SECONDS + 5
    while True:
        live = db.execute("SELECT count(*) FROM (SELECT lease_until FROM idempotency_keys WHERE scope = %s AND key = %s "
                          "UNION ALL SELECT lease_until FROM idempotency_keys_partitioned WHERE scope = %s AND key = %s"
                          ") k WHERE lease_until >= clock_timestamp()", (account, key, account, key)).fetchone()[0]
        if live == 0:
            return
        assert time.time() < deadline, f"the lease on {key} did not run out within {2 * harness.RIDES_LEASE_SECONDS} s"
        time.sleep(0.05)


def http_client_errors():
    import http.client
    return http.client.HTTPException


@rule("lease-rides")
def test_ride_crash_after_charge_resumes_with_the_same_charge(service, client, db, account):
    key = _crash_and_resume(service, client, db, account, "crash-after-charge")
    (charge,) = charges_of(db, account, key)
    assert rides_of(db, account, key) == []
    b = assert_ride(ride(service, account, key), account)
    assert b["charge_id"] == charge[0], "the retry charged again instead of getting the provider's first charge"
    assert charges_of(db, account, key) == [charge] and len(rides_of(db, account, key)) == 1


@rule("lease-rides")
def test_ride_crash_after_checkpoint_resumes_at_the_receipt(service, client, db, account):
    key = _crash_and_resume(service, client, db, account, "crash-after-checkpoint")
    [(ride_id, charge_id, sent)] = rides_of(db, account, key)
    assert not sent
    b = assert_ride(ride(service, account, key), account)
    assert (b["ride_id"], b["charge_id"]) == (ride_id, charge_id), "the retry did not resume after the checkpoint"
    assert rides_of(db, account, key) == [(ride_id, charge_id, True)] and len(charges_of(db, account, key)) == 1


@rule("lease-rides")
def test_ride_stalled_holder_is_fenced_off(service, client, db, account):
    """The holder stalls past its lease (heartbeat stopped); a retry takes over and completes; the stalled holder
    then gets 55000 at its next step and answers 409, writing nothing."""
    key = new_key()
    stall_ms = int(harness.RIDES_LEASE_SECONDS * 1000 * 2.5)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", ride(service, account, key, fault=f"stall={stall_ms}",
                                                                  timeout=stall_ms / 1000 + 15)))
    t.start()
    deadline = time.time() + 10
    while not charges_of(db, account, key) and time.time() < deadline:
        time.sleep(0.05)
    assert charges_of(db, account, key), "the stalled holder never reached its provider call"
    early = ride(service, account, key)
    assert_problem(early, 409)  # the lease is live: in progress
    wait_lease_lapsed(db, account, key)
    took_over = ride(service, account, key)
    b = assert_ride(took_over, account)
    t.join(timeout=stall_ms / 1000 + 20)
    assert_problem(out["r"], 409)
    assert rides_of(db, account, key) == [(b["ride_id"], b["charge_id"], True)]
    assert len(charges_of(db, account, key)) == 1
    assert_ride(ride(service, account, key), account, replayed=True)


@rule("lease-rides")
def test_ride_provider_503_is_not_stored(service, client, db, account):
    key = new_key()
    assert_problem(ride(service, account, key, fault="provider-503"), 503)
    assert rides_of(db, account, key) == []
    assert all(status is None for (status,) in stored(db, account, key)), "a 503 was stored"
    assert_ride(ride(service, account, key), account)


# --------------------------------------------------------------------------- one request, one answer

_J = "application/json"
_V = b'{"amount_cents": 100, "currency": "EUR"}'
# name: (body, Content-Type or None for none[, X-Fault]): sent to every service, each must answer the same
CORPUS = {
    "fault-throw-422": (_V, _J, "throw-422"), "fault-throw-502": (_V, _J, "throw-502"),
    "fault-503": (_V, _J, "503"), "fault-db-error": (_V, _J, "db-error"),
    "valid": (b'{"amount_cents": 100, "currency": "EUR"}', _J),
    "valid-charset": (b'{"amount_cents": 100, "currency": "EUR"}', _J + "; charset=utf-8"),
    "extra-field": (b'{"amount_cents": 100, "currency": "EUR", "note": "x"}', _J),
    "amount-1e2": (b'{"amount_cents": 1e2, "currency": "EUR"}', _J),
    "amount-1.0": (b'{"amount_cents": 1.0, "currency": "EUR"}', _J),
    "amount-1.5": (b'{"amount_cents": 1.5, "currency": "EUR"}', _J),
    "amount-negative": (b'{"amount_cents": -5, "currency": "EUR"}', _J),
    "amount-zero": (b'{"amount_cents": 0, "currency": "EUR"}', _J),
    "amount-string": (b'{"amount_cents": "100", "currency": "EUR"}', _J),
    "amount-null": (b'{"amount_cents": null, "currency": "EUR"}', _J),
    "amount-true": (b'{"amount_cents": true, "currency": "EUR"}', _J),
    "amount-2^53-1": (b'{"amount_cents": 9007199254740991, "currency": "EUR"}', _J),
    "amount-2^53+1": (b'{"amount_cents": 9007199254740993, "currency": "EUR"}', _J),
    "amount-2^63": (b'{"amount_cents": 9223372036854775808, "currency": "EUR"}', _J),
    "amount-huge": (b'{"amount_cents": 100000000000000000000000000000000000000, "currency": "EUR"}', _J),
    "amount-missing": (b'{"currency": "EUR"}', _J),
    "currency-lower": (b'{"amount_cents": 100, "currency": "eur"}', _J),
    "currency-4-letters": (b'{"amount_cents": 100, "currency": "EURO"}', _J),
    "currency-number": (b'{"amount_cents": 100, "currency": 978}', _J),
    "currency-missing": (b'{"amount_cents": 100}', _J),
    "array": (b'[100, "EUR"]', _J),
    "json-string": (b'"100 EUR"', _J),
    "json-null": (b"null", _J),
    "not-json": (b"amount=100&currency=EUR", _J),
    "empty": (b"", _J),
    "white-space": (b"   ", _J),
    "nul-escape": (b'{"amount_cents": 100, "currency": "E\\u0000R"}', _J),
    "not-utf8": (b'{"amount_cents": 100, "currency": "EUR", "note": "\xff"}', _J),
    "text-plain": (b'{"amount_cents": 100, "currency": "EUR"}', "text/plain"),
    "form-urlencoded": (b'{"amount_cents": 100, "currency": "EUR"}', "application/x-www-form-urlencoded"),
    "no-content-type": (b'{"amount_cents": 100, "currency": "EUR"}', None),
}


def _answer(r):
    """What must be equal everywhere: the status, the media type and, of a problem, its type, title and status."""
    if r.content_type != "application/problem+json":
        return r.status, r.content_type
    p = r.json
    return r.status, r.content_type, p.get("type"), p.get("title"), p.get("status")


@rule("same-answer")
@pytest.mark.parametrize("case", list(CORPUS))
def test_same_request_same_answer_everywhere(stack, _service_registry, case):
    body, ctype, fault = (CORPUS[case] + (None,))[:3]
    account = "e2e_same_" + uuid.uuid4().hex[:8]
    answers = {}
    for lang in selected_langs():
        svc = get_service(_service_registry, stack, lang, "direct")
        r = Client(svc.base).request("POST", "/payments", body=body, headers={
            "Authorization": f"Bearer {account}", "Idempotency-Key": new_key(), "Content-Type": ctype, "X-Fault": fault})
        answers.setdefault(_answer(r), []).append(lang)
    assert len(answers) == 1, f"{case}: {body!r} ({ctype}) answered differently:\n" + "\n".join(
        f"  {', '.join(langs)}: {a}" for a, langs in answers.items())


# --------------------------------------------------------------------------- last

def test_zz_ledger_has_one_debit_per_key(service, db, account):
    """After all of the above: no key of this service's account was debited twice."""
    dup = db.execute("SELECT account, idempotency_key, count(*) FROM ledger WHERE account IN (%s, %s || '_b') "
                     "GROUP BY account, idempotency_key HAVING count(*) > 1", (account, account)).fetchall()
    assert dup == []
    n = db.execute("SELECT count(DISTINCT idempotency_key) FROM ledger WHERE account = %s", (account,)).fetchone()[0]
    assert n > 0
    assert db.execute("SELECT count(*) FROM idempotency_keys WHERE http_status >= 500").fetchone()[0] == 0
