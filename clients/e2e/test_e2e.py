"""The article's payment story over real HTTP on loopback, for every service (go, node, python) both straight
to PostgreSQL and through PgBouncer in transaction pooling mode (clients/CONTRACT.md)."""

import http.client
import os
import socket
import threading
import time
import uuid

import pytest

import harness
from client import Client, body_of, new_key, parallel, raw_exchange
from conftest import get_service, selected_langs

PARAMS = [(l, m) for l in selected_langs() for m in harness.MODES]


@pytest.fixture(scope="session", params=PARAMS, ids=[f"{l}-{m}" for l, m in PARAMS])
def service(request, stack, _service_registry):
    return get_service(_service_registry, stack, *request.param)


_accounts = {}


@pytest.fixture(scope="session")
def account(service):
    """One account (the idempotency scope) per service and mode and run, so runs never share keys. The same one
    again when the service's last checks (conftest.RUN_LAST) come round after the other services' checks."""
    return _accounts.setdefault(service.name, f"e2e_{service.lang}_{service.mode}_{uuid.uuid4().hex[:8]}"
                                .replace("-", "_"))  # [a-z0-9_]{1,64}


@pytest.fixture
def client(service, account):
    return Client(service.base, account)  # a connection per request (no keepalive): nothing to close


rule = pytest.mark.rule  # the CONTRACT.md rule a check checks (harness.NOT_APPLICABLE names exceptions)


def cases(table, rules=None):
    """The names of a table of cases as pytest parameters, each marked with its rule where `rules` names one."""
    return [pytest.param(name, marks=[rule(rules[name])] if name in (rules or {}) else []) for name in table]


def debits(db, account, key):
    return db.execute("SELECT id, amount_cents, currency FROM ledger WHERE account = %s AND idempotency_key = %s "
                      "ORDER BY id", (account, key)).fetchall()


def ledger_rows(db, account):
    return db.execute("SELECT count(*) FROM ledger WHERE account = %s", (account,)).fetchone()[0]


def stored(db, account, key, column="http_status"):
    """The key's row (in whichever of the two tables of keys holds it): its column, or an expression of its row."""
    return db.execute(f"SELECT {column} FROM idempotency_keys WHERE scope = %s AND key = %s "
                      f"UNION ALL SELECT {column} FROM idempotency_keys_partitioned WHERE scope = %s AND key = %s",
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

def sf_string(raw):
    """The key as a quoted sf-string, its quotes and backslashes escaped."""
    return '"' + raw.replace("\\", "\\\\").replace('"', '\\"') + '"'


# name: (the key, made from a fresh one; its header on the first request; on the retries; the first request's body;
# the retries' body; None: body_of()). The key is stored as its sf-string value, whatever form its header took.
SAME_KEY = {
    "bare": (str, str, str, None, None),
    "quoted-then-bare": (str, sf_string, str, None, None),
    "bare-then-quoted": (str, str, sf_string, None, None),
    "quoted-with-escapes": (lambda k: k + '"q\\z', sf_string, sf_string, None, None),  # a quote, a backslash
    "255-bytes": (lambda k: k + "x" * (255 - len(k)), str, str, None, None),  # the longest valid key
    "comma-inside-quotes": (lambda k: k + ",x", sf_string, sf_string, None, None),  # one key, not two
    # key order and white space change neither the fingerprint nor the bytes replayed
    "key-order-and-white-space": (str, str, str, None, b'{ "currency" : "EUR",\n  "amount_cents" : 100 }'),
    "byte-identical": (str, str, str, b'{"currency":"EUR","amount_cents":100}', None),
}


@pytest.mark.parametrize("case", cases(SAME_KEY, {"comma-inside-quotes": "several-keys",
                                                  "byte-identical": "byte-identical-replay"}))
def test_retry_replays_same_response(client, db, account, case):
    """Each retry with the key, in whichever form, gets the first response again, byte for byte; one debit."""
    make, first_header, retry_header, first_body, retry_body = SAME_KEY[case]
    key = make(new_key())
    first = client.pay(first_header(key), body=first_body)
    b1 = assert_created(first, account)
    assert first.header("Idempotent-Replayed") is None, first
    for _ in range(2):
        again = client.pay(retry_header(key), body=retry_body)
        assert assert_created(again, account, replayed=True) == b1, (first, again)
        assert again.body == first.body, f"replay not byte-identical:\n{first.body!r}\n{again.body!r}"
        assert again.header("Content-Type") == first.header("Content-Type"), (first, again)
    assert debits(db, account, key) == [(b1["payment_id"], -100, "EUR")], "not one debit, under the key's value"


def test_lost_response_retry_replays(service, client, db, account):
    """The server commits the debit, the response never reaches the client, the client retries."""
    key = new_key()
    body = body_of(100)
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:  # the response is never read
        s.sendall((_head(account, key, f"Content-Length: {len(body)}") + "\r\n").encode() + body)
        harness.wait_for(lambda: debits(db, account, key), 10, 0.01)
    rows = debits(db, account, key)
    assert len(rows) == 1, f"the first request never committed its debit: {rows}"
    assert assert_created(client.pay(key), account, replayed=True)["payment_id"] == rows[0][0]
    assert debits(db, account, key) == rows


def test_parallel_clicks(service, client, db, account):
    """Five clicks with one key: the first (held 4 s in its handler) gets 201, the four others 409 at once.

    "At once" is judged against the hold, with a margin for a machine whose cores are busy: a service that waited
    for the holder's lock would answer after 3.5 s or more; each 409 must come within 2 s, a 2x margin over the
    slowest seen on a loaded machine (1.1 s at load average 17; a quiet machine answers in milliseconds)."""
    key = new_key()
    results = {}

    def click(i, fault=None):
        results[i] = Client(service.base, account).pay(key, fault=fault)

    first = threading.Thread(target=click, args=(0, "sleep=4000"))
    first.start()
    harness.wait_for(lambda: db.execute(  # until its handler sleeps, with the key claimed
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND state = 'active' AND query ILIKE '%pg_sleep%'").fetchone()[0] > 0, 3.0, 0.005)
    errors = parallel(4, lambda i: click(i + 1))
    first.join(timeout=15)
    assert not errors and len(results) == 5, (errors, results)
    assert_created(results[0], account)
    for i in range(1, 5):
        r = results[i]
        assert_problem(r, 409)
        assert r.header("Retry-After") == "1", r
        # CONTRACT.md key-lifetime: the holder's claim is not committed, so the server knows no expiry yet
        assert r.header("Idempotency-Key-Expires") is None, r
        assert r.elapsed < 2.0, f"409 took {r.elapsed * 1000:.0f} ms, the holder holds 4000 ms: {r}"
    assert len(debits(db, account, key)) == 1
    again = client.pay(key)
    assert assert_created(again, account, replayed=True) == results[0].json


def test_tampered_amount_is_422(client, db, account):
    key = new_key()
    assert_created(client.pay(key, amount=100), account)
    r = client.pay(key, amount=10000)
    assert_problem(r, 422, "idempotency-key-reused")
    assert [row[1] for row in debits(db, account, key)] == [-100]


# name: (X-Fault, body (None: a valid one), the answer's status and problem type): answered so each time, never
# replayed; nothing debited, nothing stored, and the retry with the key and a valid body claimed afresh
NOT_STORED = {
    "db-error": ("db-error", None, 500, None),  # the handler's statement fails: its debit is rolled back
    "503": ("503", None, 503, None),  # a 5xx is not cached
    "throw-502": ("throw-502", None, 502, None),  # the framework's 502 raised after the insert
    "not-json": (None, b"amount=100", 400, "request-body-not-json"),  # before the claim: the key is not consumed
    # validation before any write, answered not executed (the answer to every kind of invalid body: CORPUS below)
    "invalid-zero": (None, b'{"amount_cents": 0, "currency": "EUR"}', 422, "invalid-payment"),
    "invalid-lowercase-currency": (None, b'{"amount_cents": 100, "currency": "eur"}', 422, "invalid-payment"),
}
NOT_STORED_RULES = {"throw-502": "framework-errors", "invalid-zero": "not-executed",
                    "invalid-lowercase-currency": "not-executed"}


@pytest.mark.parametrize("case", cases(NOT_STORED, NOT_STORED_RULES))
def test_failure_is_not_stored_and_the_retry_runs(client, db, account, case):
    fault, body, status, type_suffix = NOT_STORED[case]
    key = new_key()
    for _ in range(2):
        r = client.pay(key, fault=fault, body=body)
        assert_problem(r, status, type_suffix)
        assert not r.replayed, f"a failed request's answer was replayed: {r}"
    assert debits(db, account, key) == [], "the debit of a failed request was committed"
    assert stored(db, account, key) == [], "a failed request's answer was stored"
    assert_created(client.pay(key), account, replayed=False)
    assert len(debits(db, account, key)) == 1
    assert stored(db, account, key) == [(201,)]


# name: the Idempotency-Key header, {a} and {b} standing for two fresh keys (None: no such header). Answered 400
# before any claim: nothing debited, and neither key consumed.
BAD_KEYS = {
    "missing": None,
    "empty": "",
    "empty-quoted": '""',
    "unterminated": '"abc',
    "bad-escape": '"a\\qb"',
    "trailing-garbage": '"abc"x',
    "inner-space": "ab cd",
    "control-char": '"a\tb"',  # a tab: legal in an HTTP field, a control character in the key
    "too-long": "k" * 256,
    # several keys (CONTRACT.md several-keys): HTTP joins two header lines of one field with a comma
    "comma": "{a},{b}",
    "comma-space": "{a}, {b}",
    "quoted": '"{a}", "{b}"',
    "two-lines": "{a}\r\nIdempotency-Key: {b}",
}
SEVERAL = ("comma", "comma-space", "quoted", "two-lines")


@pytest.mark.parametrize("case", cases(BAD_KEYS, dict.fromkeys(SEVERAL, "several-keys")))
def test_missing_or_bad_key_is_400(service, client, db, account, case):
    a, b = new_key("a"), new_key("b")
    header = BAD_KEYS[case] and BAD_KEYS[case].format(a=a, b=b)
    before = ledger_rows(db, account)
    r = _post_raw(service, account, header, body_of()) if case == "two-lines" else client.pay(header)
    assert_problem(r, 400, "idempotency-key-missing" if header is None else "idempotency-key-invalid")
    assert ledger_rows(db, account) == before
    assert_created(client.pay(a), account, replayed=False)  # neither key was consumed


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


def test_unprotected_endpoint(client, db, account):
    acct = account + "_u"  # its own account: the ledger rows it writes carry no idempotency key of ours
    b = assert_created(client.pay(None, path="/payments-unprotected", account=acct), acct)
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


LIMIT = 1048576
ANSWER_WITHIN = 10.0  # an early answer takes milliseconds; a service reading a body never sent waits forever


def _head(account, key, length_line, close=True):
    return (f"POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {account}\r\n"
            f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\n{length_line}\r\n"
            + ("Connection: close\r\n" if close else ""))


def _post_raw(service, account, key, body):
    return raw_exchange(service.port, _head(account, key, f"Content-Length: {len(body)}"), body)[0]


def _padded(size):
    """A valid payment body of exactly ``size`` bytes (JSON padded with spaces)."""
    core = body_of()
    return core[:-1] + b" " * (size - len(core)) + b"}"


# name: (the header line of the body's length, the bytes sent, the answer's status or None for a client that hangs
# up after them, the retry's body (None: body_of())). None is executed; the retry with the key is, once.
BODIES = {
    # 413 for a Content-Length over the limit without waiting for the body: 10 MiB announced, no byte of it sent
    "content-length-over-limit": ("Content-Length: 10485760", b"", 413, None),
    # and for a chunked body as soon as it passes the limit: one byte over, and no end of the body
    "chunked-over-limit": ("Transfer-Encoding: chunked", f"{LIMIT + 1:x}\r\n".encode() + b" " * (LIMIT + 1) + b"\r\n",
                           413, None),
    # one byte over the limit sent whole, and the retry of exactly 1 MiB accepted
    "1-mib-and-1-byte": (f"Content-Length: {LIMIT + 1}", _padded(LIMIT + 1), 413, _padded(LIMIT)),
    # the client hangs up after 37 of the 600 bytes announced, 37 bytes that are a whole payment; then the whole body
    "truncated": ("Content-Length: 600", b'{"amount_cents":100,"currency":"EUR"}', None, _padded(600)),
}


@pytest.mark.parametrize("case", cases(BODIES, dict(dict.fromkeys(BODIES, "body-limit"), truncated="whole-body")))
def test_body_not_whole_or_over_the_limit_is_not_executed(service, client, db, account, case):
    """Over the limit: 413 before any claim. A body that did not arrive whole: whatever the answer, if any. Either
    way nothing is debited or stored and the key is free. The rest of a body over the limit is never sent, so a
    service that reads on before answering times out; the connection is a keep-alive one: the service must close
    it itself rather than read the rest first."""
    length, sent, status, retry_body = BODIES[case]
    key = new_key()
    r, _ = raw_exchange(service.port, _head(account, key, length, close=False), sent, timeout=ANSWER_WITHIN,
                        hang_up=status is None)
    if status:
        assert_problem(r, status, "request-too-large")
    assert debits(db, account, key) == [] and stored(db, account, key) == []
    assert_created(client.pay(key, body=retry_body), account, replayed=False)
    assert len(debits(db, account, key)) == 1


@pytest.mark.parametrize("method,path,allow", [("GET", "/payments", "POST"), ("PUT", "/payments", "POST"),
                                               ("DELETE", "/payments", "POST"),
                                               ("GET", "/payments-unprotected", "POST"),
                                               ("POST", "/healthz", "GET, HEAD"),
                                               ("GET", "/no-such-path", None)])  # 404, not 405
@rule("method-not-allowed")
def test_wrong_method_is_405_with_allow(service, method, path, allow, account):
    r = Client(service.base, account).request(method, path, headers={"Authorization": f"Bearer {account}"})
    assert_problem(r, 404 if allow is None else 405)
    if allow:
        got = {m.strip().upper() for m in (r.header("Allow") or "").split(",") if m.strip()}
        assert got == {m.strip() for m in allow.split(",")}, r


IDLE_SECONDS = float(os.environ.get("E2E_IDLE_SECONDS", "12"))


@pytest.fixture(scope="session")
def idle_spell():
    """IDLE_SECONDS (longer than node-postgres' default 10 s idle timeout) without a request to any service.
    The tests that use it run after every other check of every service (conftest.RUN_LAST), and each touches only
    its own service: so every service has been idle for at least IDLE_SECONDS when its turn comes."""
    time.sleep(IDLE_SECONDS)


@rule("idle-409")
def test_409_at_once_after_an_idle_spell(service, idle_spell, client, db, account):
    test_parallel_clicks(service, client, db, account)


# --------------------------------------------------------------------------- the request line

def fingerprint_of(db, target, body, content_type=None):
    """The fingerprint of POST ``target`` (as sent) with ``body`` of ``content_type`` (None: hashed as JSON): the
    path up to the first ?, the query after it (none when empty)."""
    path, _, query = target.partition("?")
    return db.execute("SELECT idem_fingerprint('POST', %s, %s, %s, %s)",
                      (path, query or None, content_type, body)).fetchone()[0]


@rule("raw-target")
def test_the_target_as_sent_is_the_request(client, db, account):
    """/files/a%2Fb and /files/a/b are two requests (one key: 422), so are /files/%41 and /files/A; a trailing ? is
    no query (a replay); the stored fingerprint is the one of the target as sent."""
    key, other = new_key(), new_key()
    first = client.pay(key, path="/files/a%2Fb")
    assert_created(first, account)
    assert_problem(client.pay(key, path="/files/a/b"), 422, "idempotency-key-reused")
    again = client.pay(key, path="/files/a%2Fb?")
    assert again.status == 201 and again.replayed and again.body == first.body, (first, again)
    assert_created(client.pay(other, path="/files/%41"), account)
    assert_problem(client.pay(other, path="/files/A"), 422, "idempotency-key-reused")
    for k, target in ((key, "/files/a%2Fb"), (other, "/files/%41")):
        assert stored(db, account, k, "encode(request_hash, 'hex')") == [(fingerprint_of(db, target, body_of()),)]
    assert len(debits(db, account, key)) == len(debits(db, account, other)) == 1


@rule("session-settings")
def test_the_database_runs_under_the_session_settings(stack):
    """What the services run under (harness.DB_SETTINGS, ALTER DATABASE payments), direct and through PgBouncer: a
    setting lost on the way would leave every other check proving nothing about it."""
    import psycopg

    for url in (harness.DIRECT_URL, harness.BOUNCER_URL):
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as c:
            got = {k: c.execute("SELECT current_setting(%s)", (k,)).fetchone()[0] for k in harness.DB_SETTINGS}
        assert got == harness.DB_SETTINGS, url


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


# name: (amount, X-Fault, the answer's status and problem type): nothing charged, no ride, nothing stored, and the
# next try runs through
RIDE_REFUSED = {"invalid-body": (0, None, 422, "invalid-payment"), "provider-503": (2000, "provider-503", 503, None)}


@rule("lease-rides")
@pytest.mark.parametrize("case", list(RIDE_REFUSED))
def test_ride_refused_is_not_stored(service, db, account, case):
    amount, fault, status, type_suffix = RIDE_REFUSED[case]
    key = new_key()
    assert_problem(ride(service, account, key, fault=fault, amount=amount), status, type_suffix)
    assert charges_of(db, account, key) == [] and rides_of(db, account, key) == []
    assert all(s is None for (s,) in stored(db, account, key)), "a refused ride was stored"
    assert_ride(ride(service, account, key), account)


def wait_lease_lapsed(db, account, key):
    """Polls until the lease on the key has run out by the database's clock (the clock the extension judges a
    lease by), instead of sleeping a lease and a margin; fails if it has not after twice the lease."""
    lease = harness.RIDES_LEASE_SECONDS
    live = "lease_until >= clock_timestamp()"
    lapsed = harness.wait_for(lambda: not any(v for (v,) in stored(db, account, key, live)), 2 * lease + 5)
    assert lapsed, f"the lease on {key} did not run out within {2 * lease} s"


@rule("lease-rides")
@pytest.mark.parametrize("fault", ["crash-after-charge", "crash-after-checkpoint"])
def test_ride_crash_resumes_at_the_recovery_point(service, db, account, fault):
    """The service exits after the provider's charge (no ride yet) or after the checkpoint (the ride written, no
    receipt); restarted, the retry resumes there: the provider's first charge, the checkpoint's ride."""
    key = new_key()
    try:
        r = ride(service, account, key, fault=fault, timeout=10)
        raise AssertionError(f"the service answered instead of crashing: {r}")
    except (OSError, http.client.HTTPException):
        pass
    assert harness.wait_for(lambda: service.proc.poll() is not None, 10), "the service did not exit on " + fault
    service.stop()
    service.start()
    wait_lease_lapsed(db, account, key)  # the dead holder's lease runs out
    (charge,) = charges_of(db, account, key)
    before = rides_of(db, account, key)
    assert [r[1:] for r in before] == ([(charge[0], False)] if fault == "crash-after-checkpoint" else []), before
    b = assert_ride(ride(service, account, key), account)
    assert b["charge_id"] == charge[0], "the retry charged again instead of getting the provider's first charge"
    if before:
        assert before[0][0] == b["ride_id"], "the retry did not resume after the checkpoint"
    assert charges_of(db, account, key) == [charge]
    assert rides_of(db, account, key) == [(b["ride_id"], b["charge_id"], True)]


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
    assert harness.wait_for(lambda: charges_of(db, account, key), 10), "the stalled holder never reached the provider"
    assert_problem(ride(service, account, key), 409)  # the lease is live: in progress
    wait_lease_lapsed(db, account, key)
    b = assert_ride(ride(service, account, key), account)  # took over
    t.join(timeout=stall_ms / 1000 + 20)
    assert_problem(out["r"], 409)
    assert rides_of(db, account, key) == [(b["ride_id"], b["charge_id"], True)]
    assert len(charges_of(db, account, key)) == 1
    assert_ride(ride(service, account, key), account, replayed=True)


# --------------------------------------------------------------------------- one request, one answer

_J = "application/json"
_F = "application/x-www-form-urlencoded"
_BOUNDARY = "e2e41boundary"
_M = "multipart/form-data; boundary=" + _BOUNDARY


def _multipart(*fields):
    """A multipart/form-data body of text ``fields`` ((name, value), ...) with boundary ``_BOUNDARY``."""
    parts = [f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n' for n, v in fields]
    return ("".join(parts) + f"--{_BOUNDARY}--\r\n").encode()

_V = b'{"amount_cents": 100, "currency": "EUR"}'
# name: (body, Content-Type or None for none[, X-Fault[, target]]): sent to every service, each must answer the same;
# a request with a target (default /payments) is stored under the fingerprint of that target as sent
# (CONTRACT.md "raw-target"), checked where it is answered 201
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
    "target-trailing-?": (_V, _J, None, "/payments?"),
    "target-query": (_V, _J, None, "/payments?ref=a%2Fb&x=%41+1&&"),
    "target-%2F": (_V, _J, None, "/files/a%2Fb"),
    "target-%2f": (_V, _J, None, "/files/a%2fb"),
    "target-/": (_V, _J, None, "/files/a/b"),
    "target-%20": (_V, _J, None, "/files/a%20b"),
    "target-%41": (_V, _J, None, "/files/%41"),
    "target-utf8": (_V, _J, None, "/files/caf%C3%A9"),
    "target-%2F-trailing-?": (_V, _J, None, "/files/a%2Fb?"),
    # CONTRACT.md "any-body" (1.4): forms, multipart, text and binary to /payments and /documents, fingerprinted
    # with their content type (checked where answered 201: these name their target)
    "form": (b"amount_cents=100&currency=EUR", _F, None, "/payments"),
    "form-charset": (b"currency=EUR&amount_cents=100", _F + "; charset=utf-8", None, "/payments"),
    "form-amount-1e2": (b"amount_cents=1e2&currency=EUR", _F, None, "/payments"),
    "form-amount-1.0": (b"amount_cents=1.0&currency=EUR", _F, None, "/payments"),
    "form-amount-zero": (b"amount_cents=0&currency=EUR", _F, None, "/payments"),
    "form-amount-missing": (b"currency=EUR", _F, None, "/payments"),
    "form-currency-lower": (b"amount_cents=100&currency=eur", _F, None, "/payments"),
    "multipart": (_multipart(("amount_cents", "100"), ("currency", "EUR")), _M, None, "/payments"),
    "multipart-amount-1.5": (_multipart(("amount_cents", "1.5"), ("currency", "EUR")), _M, None, "/payments"),
    "multipart-currency-missing": (_multipart(("amount_cents", "100")), _M, None, "/payments"),
    "text-not-json": (b"one hundred euros", "text/plain", None, "/payments"),
    "binary-payment": (bytes(range(256)), "application/octet-stream", None, "/payments"),
    "documents-text": ("caf\u00e9\n".encode(), "text/plain; charset=utf-8", None, "/documents"),
    "documents-binary": (bytes(range(256)), "application/octet-stream", None, "/documents"),
    "documents-empty": (b"", None, None, "/documents"),
    "documents-empty-text": (b"", "text/plain", None, "/documents"),
    "documents-json": (b'{"b": [1, 2], "a": "x"}', _J, None, "/documents"),
    "documents-json-invalid": (b"{nope", _J, None, "/documents"),
    "documents-form": (b"a=1&b=2", _F, None, "/documents"),
    "documents-multipart": (_multipart(("a", "1"), ("b", "two")), _M, None, "/documents"),
}


ANY_BODY_CASES = frozenset(list(CORPUS)[list(CORPUS).index("form"):])


@rule("any-body")
@pytest.mark.parametrize("ctype,body,amount", [
    (_F, b"currency=EUR&amount_cents=321", 321),
    (_M, _multipart(("currency", "EUR"), ("amount_cents", "321")), 321),
    ("text/plain", b'{"amount_cents": 321, "currency": "EUR"}', 321),
], ids=["form", "multipart", "text-json"])
def test_any_body_payment_is_read_by_the_framework_and_replays(client, db, account, ctype, body, amount):
    """A form or multipart payment is read by the framework's own parser (the amount answered is the field's), a
    JSON body sent as text/plain as JSON; the same bytes replay; other bytes, or the same bytes as another content
    type, are another request (422); one debit."""
    key = new_key()
    first = client.pay(key, body=body, headers={"Content-Type": ctype})
    assert_created(first, account, amount=amount)
    again = client.pay(key, body=body, headers={"Content-Type": ctype})
    assert again.status == 201 and again.replayed and again.body == first.body, (first, again)
    assert_problem(client.pay(key, body=body.replace(b"321", b"322"), headers={"Content-Type": ctype}), 422,
                   "idempotency-key-reused")
    other = "application/octet-stream" if ctype != "application/octet-stream" else "text/plain"
    assert_problem(client.pay(key, body=body, headers={"Content-Type": other}), 422, "idempotency-key-reused")
    assert stored(db, account, key, "encode(request_hash, 'hex')") == [(fingerprint_of(db, "/payments", body,
                                                                                          ctype),)]
    assert len(debits(db, account, key)) == 1


@rule("any-body")
def test_any_body_unreadable_payment_is_not_executed(client, db, account):
    """A body the payment handler cannot read (text that is not JSON) -> not-executed 400: the key is released,
    the corrected retry with the same key runs."""
    key = new_key()
    assert_problem(client.pay(key, body=b"one hundred euros", headers={"Content-Type": "text/plain"}), 400,
                   "request-body-not-json")
    assert stored(db, account, key) == [] and debits(db, account, key) == []
    assert_created(client.pay(key, body=b"amount_cents=100&currency=EUR", headers={"Content-Type": _F}), account)


@rule("any-body")
@pytest.mark.parametrize("ctype,body", [
    ("text/plain; charset=utf-8", "caf\u00e9\n".encode()), ("application/octet-stream", bytes(range(256))),
    (None, b""), (_J, b'{"b": [1, 2], "a": "x"}'), (_F, b"a=1&b=2"), (_M, _multipart(("a", "1"))),
], ids=["text", "binary", "empty", "json", "form", "multipart"])
def test_any_body_documents_stores_the_bytes_and_replays(client, db, account, ctype, body):
    """POST /documents stores any body as it came (the row holds the bytes and the content type), answers their
    length and SHA-256; the same bytes replay; other bytes or another content type -> 422."""
    import hashlib
    key = new_key()
    hdrs = {"Content-Type": ctype}
    first = client.pay(key, body=body, headers=hdrs, path="/documents")
    assert first.status == 201 and first.content_type == "application/json" and not first.replayed, first
    doc = first.json
    assert doc == {"document_id": doc["document_id"], "content_type": ctype, "bytes": len(body),
                   "sha256": hashlib.sha256(body).hexdigest()}, first
    assert first.header("Location") == f"/documents/{doc['document_id']}", first
    again = client.pay(key, body=body, headers=hdrs, path="/documents")
    assert again.status == 201 and again.replayed and again.body == first.body, (first, again)
    other = b"[]" if ctype in (None, _J) else body + b"x"  # still JSON where the fingerprint wants JSON
    assert_problem(client.pay(key, body=other, headers=hdrs, path="/documents"), 422, "idempotency-key-reused")
    assert_problem(client.pay(key, body=body, headers={"Content-Type": "application/x-other"}, path="/documents"),
                   422, "idempotency-key-reused")
    rows = db.execute("SELECT content_type, body FROM documents WHERE account = %s AND idempotency_key = %s",
                      (account, key)).fetchall()
    assert rows == [(ctype, body)]


def _answer(r):
    """What must be equal everywhere: the status, the media type and, of a problem, its type, title and status."""
    if r.content_type != "application/problem+json":
        return r.status, r.content_type
    p = r.json
    return r.status, r.content_type, p.get("type"), p.get("title"), p.get("status")


IMF_FIXDATE = r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$"
HTTP_DATE_OF_EXPIRES_AT = "to_char(expires_at AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS \"GMT\"')"


@rule("key-lifetime")
def test_key_lifetime_on_first_answer_replay_and_422_never_stored(client, db, account):
    """Idempotency-Key-Expires (1.4): the first answer and its replay say the same date, the key's expires_at in GMT
    (under the e2e database's DateStyle 'SQL, DMY' and TimeZone 'Asia/Kolkata'), the 422 too; the stored row holds
    no such header; a 5xx (nothing stored) carries none."""
    import re
    key = new_key()
    first = client.pay(key)
    assert_created(first, account)
    date = first.header("Idempotency-Key-Expires")
    assert date and re.match(IMF_FIXDATE, date), first
    again = client.pay(key)
    assert_created(again, account, replayed=True)
    assert again.header("Idempotency-Key-Expires") == date, again
    mismatch = client.pay(key, amount=10000)
    assert_problem(mismatch, 422, "idempotency-key-reused")
    assert mismatch.header("Idempotency-Key-Expires") == date, mismatch
    assert stored(db, account, key, HTTP_DATE_OF_EXPIRES_AT) == [(date,)]
    [(headers,)] = stored(db, account, key, "coalesce(response_headers::text, '')")
    assert "idempotency-key-expires" not in headers.lower(), headers
    failed = client.pay(new_key(), fault="503")
    assert failed.status == 503 and failed.header("Idempotency-Key-Expires") is None, failed


@rule("key-lifetime")
@rule("lease-rides")
def test_key_lifetime_on_rides(service, db, account):
    """Lease mode: the first answer and the replay carry the key's expiry (a heartbeat may move it later, never
    earlier); the stored row holds no such header."""
    import re
    from email.utils import parsedate_to_datetime
    key = new_key()
    first = ride(service, account, key)
    assert_ride(first, account)
    date = first.header("Idempotency-Key-Expires")
    assert date and re.match(IMF_FIXDATE, date), first
    again = ride(service, account, key)
    assert_ride(again, account, replayed=True)
    later = again.header("Idempotency-Key-Expires")
    assert later and parsedate_to_datetime(later) >= parsedate_to_datetime(date), (first, again)
    assert stored(db, account, key, HTTP_DATE_OF_EXPIRES_AT) == [(later,)]
    [(headers,)] = stored(db, account, key, "coalesce(response_headers::text, '')")
    assert "idempotency-key-expires" not in headers.lower(), headers


@rule("same-answer")
@pytest.mark.parametrize("case", list(CORPUS))
def test_same_request_same_answer_everywhere(stack, _service_registry, db, case):
    body, ctype, fault, target = (CORPUS[case] + (None, None))[:4]
    account = "e2e_same_" + uuid.uuid4().hex[:8]
    answers, fingerprints = {}, {}
    for lang in selected_langs():
        svc = get_service(_service_registry, stack, lang, "direct")
        key = new_key()
        r = Client(svc.base).request("POST", target or "/payments", body=body, headers={
            "Authorization": f"Bearer {account}", "Idempotency-Key": key, "Content-Type": ctype, "X-Fault": fault})
        answers.setdefault(_answer(r), []).append(lang)
        if target and r.status == 201:
            rows = stored(db, account, key, "encode(request_hash, 'hex')")
            fingerprints.setdefault(rows[0][0] if rows else None, []).append(lang)
    assert len(answers) == 1, f"{case}: {body!r} ({ctype}) {target or ''} answered differently:\n" + "\n".join(
        f"  {', '.join(langs)}: {a}" for a, langs in answers.items())
    if fingerprints:
        # 1.3 cases hash the body as JSON (content type NULL, as 1.3 clients sent it: the same hash for a JSON
        # type); the any-body cases with their content type
        want = fingerprint_of(db, target, body, ctype if case in ANY_BODY_CASES else None)
        assert list(fingerprints) == [want], f"{case}: {target} not fingerprinted as sent ({want}):\n" + "\n".join(
            f"  {', '.join(langs)}: {f}" for f, langs in fingerprints.items())


# --------------------------------------------------------------------------- keys of older clients

# The clients' statements before 1.4, verbatim (TAP 149 and 177 have them too): 1.2's (clients/go at b5ec4af
# claimSQL and completeSQL; Node.js and Python sent the same composition), a jsonb response; 1.3's, the request's
# parts with content type NULL (as every 1.3 client sent it) and the response's bytes. A key stored through the 1.0
# functions on this 1.4 database is the row a 1.2 database holds after ALTER EXTENSION idempotency UPDATE (the
# same columns: response_body jsonb, response_headers with the Content-Type, response_bytes and
# response_content_type NULL, the same request_hash), and a 1.3 key the row the 1.3 statements left; TAP 149, 177
# and 178 update real 1.2 and 1.3 databases and replay their keys through the claim every client sends.
CLAIM_1_2 = ("SELECT c.outcome FROM idem_claim(%s::text, idem_hash(jsonb_build_object('method', %s::text, "
             "'path', %s::text, 'body', %s::jsonb)), %s::interval, %s::text) AS c")
COMPLETE_1_2 = "SELECT idem_complete(%s::text, %s::int, %s::jsonb, %s::jsonb, %s::text)"
CLAIM_1_3 = "SELECT (idem_claim_request(%s, %s, %s, %s, %s, %s, %s, %s)).outcome"
COMPLETE_1_3 = "SELECT idem_complete_request(%s, %s, %s, %s, %s, %s)"


def _store_as_an_older_client(db, version, account, key, first_body):
    """The first request's answer, stored as a client of `version` stored it: the bytes its replay must give."""
    answer = '{"payment_id": 7, "account": "%s", "amount_cents": 100, "currency": "EUR"}' % account
    with db.transaction():
        if version == "1.2":
            assert db.execute(CLAIM_1_2, (key, "POST", "/payments", first_body, None, account)).fetchone() == ("claimed",)
            db.execute(COMPLETE_1_2, (key, 201, answer,
                                      '{"Content-Type": "application/json", "Location": "/payments/7"}', account))
            return db.execute("SELECT %s::jsonb::text", (answer,)).fetchone()[0].encode()  # jsonb's text of it
        assert db.execute(CLAIM_1_3, (key, account, "POST", "/payments", None, None, first_body.encode(),
                                      None)).fetchone() == ("claimed",)
        db.execute(COMPLETE_1_3, (key, account, 201, "application/json", '{"Location": "/payments/7"}',
                                  answer.encode()))
        return answer.encode()


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_a_key_stored_by_an_older_client_replays(client, db, account, version):
    """A key stored before the update by a 1.2 or a 1.3 client (a deploy that updates the extension under keys
    still in their ttl, then rolls out this service) replays through this service: the stored status, Content-Type,
    Location and bytes, for the same payment spelled another way, and the handler never runs."""
    key = new_key("old")
    sent = _store_as_an_older_client(db, version, account, key, '{"amount_cents": 100, "currency": "EUR"}')
    r = client.pay(key, body=b'{ "currency" : "EUR", "amount_cents" : 100 }')
    assert (r.status, r.replayed, r.content_type, r.header("Location")) == (201, True, "application/json",
                                                                            "/payments/7"), r
    assert r.body == sent, r
    assert debits(db, account, key) == [], "the handler ran for a key stored by an older client"
    assert_problem(client.pay(key, amount=200), 422)  # another payment under the key: a mismatch, as before


# --------------------------------------------------------------------------- expired (1.4, tombstones)

def _tombstone_ttl_is(value):
    """A new session (PostgreSQL's, and PgBouncer's server connections from the same configuration) reads value
    (unset reads as 0: the managed edition's setting is a placeholder, unknown until it is set)."""
    import psycopg

    with psycopg.connect(harness.DIRECT_URL, autocommit=True) as c:
        return c.execute("SELECT coalesce(nullif(current_setting('idempotency.tombstone_ttl', true), ''), '0')"
                         ).fetchone()[0] == value


def _set_tombstone_ttl(db, value):
    """idempotency.tombstone_ttl for every session of the stack, the services' open ones included: a file the
    server's configuration includes, and a reload (the payments database sets no tombstone_ttl of its own, so the
    server's value is the sessions'). Not ALTER SYSTEM, which refuses the managed edition's placeholder setting.
    Open sessions read the new value from their next message on."""
    config = db.execute("SHOW config_file").fetchone()[0]
    extra = os.path.join(os.path.dirname(config), "e2e_tombstones.conf")
    include = "include_if_exists = 'e2e_tombstones.conf'\n"
    with open(config) as f:
        if include not in f.read():
            with open(config, "a") as g:
                g.write("\n" + include)
    with open(extra, "w") as f:
        f.write("" if value is None else f"idempotency.tombstone_ttl = '{value}'\n")
    os.chmod(extra, 0o644)
    db.execute("SELECT pg_reload_conf()")
    assert harness.wait_for(lambda: _tombstone_ttl_is(value or "0"), 10), f"tombstone_ttl {value} not in force"
    time.sleep(0.5)  # the postmaster signals the open sessions right after it read the file itself


@pytest.fixture
def tombstones_on(db):
    """Tombstones on (idempotency.tombstone_ttl = 30d) for the length of one check, as a DBA turns them on; every
    other check runs with the default 0, so nothing else is changed (no other check lets a key expire)."""
    _set_tombstone_ttl(db, "30d")
    try:
        yield
    finally:
        _set_tombstone_ttl(db, None)


def _expire(db, account, key, via):
    """The key's response expires now without waiting: its expires_at moved an hour into the past ("row": the
    expired row stays in the key table), then for "tombstone" the sweeper's pass (idem_cleanup(), under the
    session's tombstone_ttl) turns it into a tombstone."""
    for table in ("idempotency_keys", "idempotency_keys_partitioned"):
        db.execute(f"UPDATE {table} SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' "
                   "WHERE scope = %s AND key = %s", (account, key))
    assert stored(db, account, key, "expires_at < now()") == [(True,)]
    if via == "tombstone":
        db.execute("SET idempotency.tombstone_ttl = '30d'")
        try:
            db.execute("SELECT idem_cleanup()")
        finally:
            db.execute("RESET idempotency.tombstone_ttl")
        assert stored(db, account, key) == [], "the sweep left the expired row"
        assert tombstones_of(db, account, key) == 1, "the sweep wrote no tombstone"


def tombstones_of(db, account, key):
    return db.execute("SELECT count(*) FROM idempotency_tombstones WHERE scope = %s AND key = %s",
                      (account, key)).fetchone()[0]


def _key_state(db, account, key):
    return (stored(db, account, key, "(http_status, expires_at, md5(response_bytes))"),
            tombstones_of(db, account, key))


EXPIRED_VIA = ["row", "tombstone"]


@rule("expired")
@pytest.mark.parametrize("via", EXPIRED_VIA)
def test_expired_key_answers_410_and_runs_nothing(tombstones_on, client, db, account, via):
    """With tombstones on, a retry of a completed key whose response expired (its row still there, or swept into a
    tombstone) answers 410 problem idempotency-key-expired, with the first request's body and with another (whatever
    the request hash), runs nothing (one debit) and stores nothing (the key's row and tombstone as they were)."""
    key = new_key()
    assert_created(client.pay(key), account)
    _expire(db, account, key, via)
    before = _key_state(db, account, key)
    for amount in (100, 250):
        assert_problem(client.pay(key, amount=amount), 410, "idempotency-key-expired")
    assert len(debits(db, account, key)) == 1, "an expired key ran again"
    assert _key_state(db, account, key) == before, "an expired key's retry stored something"


@rule("expired")
@pytest.mark.parametrize("via", EXPIRED_VIA)
def test_expired_key_with_tombstones_off_is_claimed_again(client, db, account, via):
    """With idempotency.tombstone_ttl at its default 0 the same late retry is claimed and runs again, as in 1.3,
    even while the key's tombstone exists. (An account of its own: this key is debited twice on purpose.)"""
    assert _tombstone_ttl_is("0")
    acct, key = account + "_t0", new_key()
    first = assert_created(client.pay(key, account=acct), acct)
    _expire(db, acct, key, via)
    again = assert_created(client.pay(key, account=acct), acct)
    assert again["payment_id"] != first["payment_id"]
    assert len(debits(db, acct, key)) == 2
    assert stored(db, acct, key, "expires_at > now()") == [(True,)], "the claim again stored no live row"


@rule("expired")
@rule("lease-rides")
@pytest.mark.parametrize("via", EXPIRED_VIA)
def test_expired_ride_answers_410_and_runs_nothing(tombstones_on, service, db, account, via):
    """Lease mode (POST /rides): a late retry of a completed ride is 410 too, with no second charge or ride."""
    key = new_key()
    b = assert_ride(ride(service, account, key), account)
    _expire(db, account, key, via)
    before = _key_state(db, account, key)
    assert_problem(ride(service, account, key), 410, "idempotency-key-expired")
    assert rides_of(db, account, key) == [(b["ride_id"], b["charge_id"], True)]
    assert charges_of(db, account, key) == [(b["charge_id"],)]
    assert _key_state(db, account, key) == before, "an expired ride's retry stored something"


# --------------------------------------------------------------------------- last

def test_zz_ledger_has_one_debit_per_key(service, db, account):
    """After all of the above: no key of this service's account was debited twice."""
    dup = db.execute("SELECT account, idempotency_key, count(*) FROM ledger WHERE account IN (%s, %s || '_b') "
                     "GROUP BY account, idempotency_key HAVING count(*) > 1", (account, account)).fetchall()
    assert dup == []
    n = db.execute("SELECT count(DISTINCT idempotency_key) FROM ledger WHERE account = %s", (account,)).fetchone()[0]
    assert n > 0
    assert db.execute("SELECT count(*) FROM idempotency_keys WHERE http_status >= 500").fetchone()[0] == 0
