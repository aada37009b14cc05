"""Python client: what the idempotency middleware costs against a bare transactional handler, in one run.

In process (no HTTP, so the database round trips and the middleware's own work are what is measured), THREADS
threads on a psycopg pool of as many connections, each doing the payment handler's INSERT as fast as it can,
in these ways:

    autocommit     the INSERT alone, autocommit (1 round trip)
    bare-tx        BEGIN, the INSERT, COMMIT (`with conn.transaction()`: 3 round trips)
    mw-message     IdempotencyMiddleware (WSGI, in process), a fresh key per request: BEGIN + claim as one
                   multi-statement message (ClientCursor), the INSERT, complete + COMMIT as one message (3)
    mw-separate    the same middleware sending BEGIN, claim, INSERT, complete, COMMIT one by one (5)
    mw-pipeline    the same middleware sending each pair in psycopg's pipeline mode (3)

straight to PostgreSQL and through PgBouncer (transaction pooling).  Rounds rotate the order; each figure is the
median of the rounds' requests/s.  Usage (as root, the extension installed in PostgreSQL 15):

    /usr/bin/python3 bench/clients/python_roundtrips.py            # writes bench/clients/RESULTS-python.md

Knobs: BENCH_ROUNDS (5), BENCH_SECONDS (4), BENCH_THREADS (8), BENCH_OUT.
"""

import datetime
import fcntl
import io
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "clients", "e2e"))
sys.path.insert(0, os.path.join(REPO, "clients", "python", "src"))
import harness  # noqa: E402

from idempotency_pg import CONNECTION, IdempotencyMiddleware, connection_pool, json_response  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
THREADS = int(os.environ.get("BENCH_THREADS", "8"))
OUT = os.environ.get("BENCH_OUT", os.path.join(HERE, "RESULTS-python.md"))
WAYS = ["autocommit", "bare-tx", "mw-message", "mw-separate", "mw-pipeline"]
INSERT = ("INSERT INTO ledger (account, amount_cents, currency, idempotency_key) "
          "VALUES (%s::text, %s::bigint, %s::text, %s::text) RETURNING id")
BODY = b'{"amount_cents": 100, "currency": "EUR"}'


def handler(environ, start_response):
    (pid,) = environ[CONNECTION].execute(INSERT, ("bench", -100, "EUR", environ["idempotency_pg.key"])).fetchone()
    r = json_response(201, {"payment_id": pid, "account": "bench", "amount_cents": 100, "currency": "EUR"},
                      [("Location", "/payments/%d" % pid)])
    start_response(r.status_line(), r.wsgi_headers())
    return [r.body]


def make_op(way, pool):
    if way == "autocommit":
        def op():
            with pool.connection() as conn:
                conn.execute(INSERT, ("bench", -100, "EUR", "")).fetchone()
        return op
    if way == "bare-tx":
        def op():
            with pool.connection() as conn:
                with conn.transaction():
                    conn.execute(INSERT, ("bench", -100, "EUR", "")).fetchone()
        return op
    combine = {"mw-message": True, "mw-separate": False, "mw-pipeline": "pipeline"}[way]
    mw = IdempotencyMiddleware(handler, pool, scope=lambda e: "bench", combine=combine)

    def op():
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/payments", "CONTENT_LENGTH": str(len(BODY)),
                   "wsgi.input": io.BytesIO(BODY), "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex}
        r = mw.handle(environ)
        if r.status != 201:
            raise RuntimeError("middleware answered %d: %r" % (r.status, r.body[:200]))
    return op


def measure(op):
    stop = time.monotonic() + SECONDS
    counts = [0] * THREADS
    errors = []

    def worker(i):
        try:
            while time.monotonic() < stop:
                op()
                counts[i] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return sum(counts) / (time.monotonic() - t0)


def main():
    lock = open("/tmp/idempotency-clients-e2e.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    stack = tempfile.mkdtemp(prefix="idem-bench-py.")
    results = {}
    try:
        harness.stack_up(stack)
        for mode in harness.MODES:
            pool = connection_pool(harness.database_url(mode), min_size=THREADS, max_size=THREADS, timeout=10)
            pool.wait(timeout=30)
            ops = {w: make_op(w, pool) for w in WAYS}
            for w in WAYS:  # warm-up
                for _ in range(20):
                    ops[w]()
            # One thread alone: wall time and this process's CPU time per operation (where the time goes)
            solo = {}
            for w in WAYS:
                n, t0, c0 = 0, time.monotonic(), time.process_time()
                while time.monotonic() - t0 < SECONDS / 2:
                    ops[w]()
                    n += 1
                solo[w] = ((time.monotonic() - t0) / n * 1000, (time.process_time() - c0) / n * 1000)
            results.setdefault("_solo", {})[mode] = solo
            per = {w: [] for w in WAYS}
            for rnd in range(ROUNDS):
                order = WAYS[rnd % len(WAYS):] + WAYS[:rnd % len(WAYS)]
                if rnd % 2:
                    order = order[::-1]
                for w in order:
                    rps = measure(ops[w])
                    per[w].append(rps)
                    print(f"[bench] {mode:9s} {w:12s} round {rnd + 1}: {rps:8.1f}/s", file=sys.stderr, flush=True)
            pool.close()
            results[mode] = per
    finally:
        harness.stack_down(stack)
        lock.close()
    write(results)


def write(results):
    import psycopg
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"]
    L = ["# Python client: the middleware against a bare transactional handler (same run)", "",
         f"- date: {now}; psycopg {psycopg.__version__} ({psycopg.pq.__impl__} implementation), "
         f"{os.cpu_count()} cores shared with other work (load average at the end: {' '.join(load)})",
         f"- `/usr/bin/python3 bench/clients/python_roundtrips.py` (BENCH_ROUNDS={ROUNDS} BENCH_SECONDS={SECONDS:g} "
         f"BENCH_THREADS={THREADS}); in process, {THREADS} threads on a pool of {THREADS} connections, a fresh key "
         "per request; each figure the median of the rounds' operations/s, the order rotated every round", "",
         "| mode | way | round trips | median ops/s | / bare-tx | / autocommit | rounds |",
         "|---|---|---:|---:|---:|---:|---|"]
    trips = {"autocommit": 1, "bare-tx": 3, "mw-message": 3, "mw-separate": 5, "mw-pipeline": 3}
    solo = results.pop("_solo", {})
    for mode, per in results.items():
        bare = statistics.median(per["bare-tx"])
        auto = statistics.median(per["autocommit"])
        for w in WAYS:
            m = statistics.median(per[w])
            L.append(f"| {mode} | {w} | {trips[w]} | {m:.0f} | {m / bare:.2f} | {m / auto:.2f} | "
                     + ", ".join(f"{x:.0f}" for x in per[w]) + " |")
    L += ["", "One thread alone (before the rounds): milliseconds per operation, wall and this process's CPU "
          "(the Python side: psycopg without C speedups, the middleware); wall minus CPU is mostly waiting for "
          "PostgreSQL", "", "| mode | way | wall ms/op | client CPU ms/op |", "|---|---|---:|---:|"]
    for mode, per in solo.items():
        for w in WAYS:
            L.append(f"| {mode} | {w} | {per[w][0]:.2f} | {per[w][1]:.2f} |")
    with open(OUT, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
