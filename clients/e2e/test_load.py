"""A bounded load test of each service through PgBouncer (transaction pooling), loopback only.

E2E_LOAD_SECONDS (default 6) seconds of E2E_LOAD_THREADS (default 16) clients on kept-alive connections:
half the requests on a few hot keys, half on fresh keys, one in ten with X-Fault: 503. Then:
  - no key has two debits in the ledger;
  - no stored response has a 5xx status, and every key that got a 503 but never a 201 is claimed afresh on retry;
  - no key is stuck: every key used answers a replay or a fresh 201, never 409.
"""

import collections
import os
import random
import threading
import time
import uuid

import pytest

from client import Client, new_key, parallel
from conftest import get_service, selected_langs

SECONDS = float(os.environ.get("E2E_LOAD_SECONDS", "6"))
THREADS = int(os.environ.get("E2E_LOAD_THREADS", "16"))
HOT_KEYS = 8
P_HOT = 0.5
P_503 = 0.1
ALLOWED = {201, 409, 503}

LANGS = selected_langs()


@pytest.fixture(scope="session", params=LANGS, ids=[f"{l}-pgbouncer" for l in LANGS])
def bounced(request, stack, _service_registry):
    return get_service(_service_registry, stack, request.param, "pgbouncer")


@pytest.mark.load
def test_load_through_pgbouncer(bounced, db, capsys):
    svc = bounced
    account = f"load_{svc.lang}_{uuid.uuid4().hex[:8]}".replace("-", "_")  # [a-z0-9_]{1,64}
    hot = [new_key("hot") for _ in range(HOT_KEYS)]
    lock = threading.Lock()
    seen = collections.defaultdict(list)  # key -> [(status, replayed, fault)]
    unexpected = []
    counts = collections.Counter()
    deadline = time.monotonic() + SECONDS

    def worker(i):
        rnd = random.Random(i)
        c = Client(svc.base, account, timeout=10)
        try:
            while time.monotonic() < deadline:
                key = rnd.choice(hot) if rnd.random() < P_HOT else new_key("fresh")
                fault = "503" if rnd.random() < P_503 else None
                try:
                    r = c.pay(key, fault=fault, keepalive=True)
                except Exception as e:  # noqa: BLE001
                    c.close()
                    with lock:
                        unexpected.append(f"{key}: {e!r}")
                        seen[key].append((None, False, fault))
                    continue
                with lock:
                    counts[r.status] += 1
                    seen[key].append((r.status, r.replayed, fault))
                    if r.status not in ALLOWED or (r.status == 503 and fault is None):
                        unexpected.append(f"{key} fault={fault}: {r!r}")
        finally:
            c.close()

    t0 = time.monotonic()
    errs = parallel(THREADS, worker)
    took = time.monotonic() - t0
    total = sum(counts.values())
    line = (f"[load] {svc.name}: {total} requests in {took:.1f} s ({total / took:.0f}/s) with {THREADS} clients, "
            f"{len(seen)} keys, statuses {dict(sorted(counts.items()))}, unexpected {len(unexpected)}")
    with capsys.disabled():
        print("\n" + line, flush=True)
    assert not errs, errs[:5]
    assert total > 0
    assert counts[201] > 0 and counts[503] > 0, counts

    # 0 duplicate debits
    dup = db.execute("SELECT idempotency_key, count(*) FROM ledger WHERE account = %s GROUP BY 1 "
                     "HAVING count(*) > 1", (account,)).fetchall()
    assert dup == [], f"keys debited twice: {dup[:10]}"
    ledger = dict(db.execute("SELECT idempotency_key, id FROM ledger WHERE account = %s", (account,)).fetchall())
    got_201 = {k for k, v in seen.items() if any(s == 201 for s, _, _ in v)}
    assert set(ledger) == got_201, (f"debited without a 201: {sorted(set(ledger) - got_201)[:5]}; "
                                    f"201 without a debit: {sorted(got_201 - set(ledger))[:5]}")

    # 0 cached 5xx
    cached = db.execute("SELECT scope, key, http_status FROM idempotency_keys WHERE http_status >= 500 UNION ALL "
                        "SELECT scope, key, http_status FROM idempotency_keys_partitioned WHERE http_status >= 500"
                        ).fetchall()
    assert cached == [], f"stored 5xx responses: {cached[:10]}"

    # 0 stuck keys: every key answers a replay of its 201 or, if it never got one, a fresh 201
    keys = sorted(seen)
    retry_bad = []

    def check(i):
        c = Client(svc.base, account, timeout=10)
        try:
            for key in keys[i::THREADS]:
                r = c.pay(key, keepalive=True)
                if key in ledger:
                    ok = r.status == 201 and r.replayed and r.json.get("payment_id") == ledger[key]
                else:
                    ok = r.status == 201 and not r.replayed
                if not ok:
                    with lock:
                        retry_bad.append(f"{key} (statuses {[s for s, _, _ in seen[key]]}): {r!r}")
        finally:
            c.close()

    errs = parallel(THREADS, check)
    assert not errs, errs[:5]
    stuck = [b for b in retry_bad if " <409 " in b]
    assert not stuck, f"{len(stuck)} keys stuck at 409 after the load: {stuck[:5]}"
    assert not retry_bad, f"{len(retry_bad)} keys answered wrongly on retry: {retry_bad[:5]}"
    per_key = db.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM ledger WHERE account = %s",
                         (account,)).fetchone()
    assert per_key == (len(keys), len(keys)), f"ledger rows/keys {per_key} after retrying {len(keys)} keys"
    assert not unexpected, f"{len(unexpected)} unexpected answers during the load: {unexpected[:5]}"
