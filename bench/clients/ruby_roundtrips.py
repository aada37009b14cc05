"""Ruby client: what the idempotency middleware costs against a bare transactional handler, in one run, and what
pipelining BEGIN with the claim and the completion with COMMIT buys (issue 42).

In process (no HTTP: the database round trips and the middleware's own work are what is measured), one Ruby
process per measurement (bench/clients/ruby_roundtrips.rb): THREADS threads on an IdempotencyPg::Pool of as many
connections, each running the payment handler's INSERT as fast as it can, in these ways:

    autocommit     the INSERT alone, autocommit (1 round trip)
    bare-tx        PgBackend's transaction without a key: BEGIN, the INSERT, COMMIT (3)
    mw-pipeline    IdempotencyPg::Middleware, a fresh key per request: BEGIN + claim, the INSERT, completion +
                   COMMIT, each pair pipelined (3; the default)
    mw-plain       the same with PgBackend.new(pool, pipeline: false): BEGIN, claim, INSERT, completion, COMMIT (5)

straight to PostgreSQL and through PgBouncer (transaction pooling), with THREADS threads and with one thread alone
(where a round trip's latency shows undiluted). Rounds rotate the order; each figure is the median of the rounds'
operations/s. Usage (as root, the extension installed in PG_BIN's PostgreSQL):

    PG_BIN=... /usr/bin/python3 bench/clients/ruby_roundtrips.py      # writes bench/clients/RESULTS-ruby-roundtrips.md

Knobs: BENCH_ROUNDS (5), BENCH_SECONDS (4), BENCH_THREADS (8), BENCH_OUT; IDEM_E2E_PORT_BASE moves the stack;
BENCH_MODES (direct,pgbouncer; also "delayed": straight to PostgreSQL through a proxy in this process that holds
every chunk BENCH_DELAY_MS / 2 (default 1) in each direction before passing it on, a network's round-trip time
that loopback lacks; on BENCH_PROXY_PORT, default the stack's PostgreSQL port + 49).
"""

import datetime
import fcntl
import os
import statistics
import subprocess
import sys
import socket
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "clients", "e2e"))
import harness  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
THREADS = int(os.environ.get("BENCH_THREADS", "8"))
OUT = os.environ.get("BENCH_OUT", os.path.join(HERE, "RESULTS-ruby-roundtrips.md"))
WAYS = ["autocommit", "bare-tx", "mw-pipeline", "mw-plain"]
TRIPS = {"autocommit": 1, "bare-tx": 3, "mw-pipeline": 3, "mw-plain": 5}
MODES = [m for m in os.environ.get("BENCH_MODES", "direct,pgbouncer").split(",") if m]
DELAY = float(os.environ.get("BENCH_DELAY_MS", "1")) / 1000
PROXY_PORT = int(os.environ.get("BENCH_PROXY_PORT", str(harness.PG_PORT + 49)))


def delay_proxy(stop):
    """A TCP proxy to PostgreSQL on PROXY_PORT: each chunk read is held DELAY / 2, then written on."""
    srv = socket.create_server(("127.0.0.1", PROXY_PORT), reuse_port=False)
    srv.settimeout(0.2)

    def pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                time.sleep(DELAY / 2)
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    while not stop.is_set():
        try:
            c, _ = srv.accept()
        except socket.timeout:
            continue
        u = socket.create_connection(("127.0.0.1", harness.PG_PORT))
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(c, u), daemon=True).start()
        threading.Thread(target=pump, args=(u, c), daemon=True).start()
    srv.close()


def url_of(mode):
    if mode == "delayed":
        return f"postgresql://postgres@127.0.0.1:{PROXY_PORT}/{harness.DB}"
    return harness.database_url(mode)


def measure(mode, way, threads):
    out = subprocess.run(["nice", "-n", "10", "ruby", os.path.join(HERE, "ruby_roundtrips.rb"),
                          url_of(mode), way, str(SECONDS), str(threads)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} {way}: {out.stdout[-2000:]}")
    rps, cpu = out.stdout.split()[-2:]
    return float(rps), float(cpu)


def main():
    lock = open(harness.LOCK, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    stack = tempfile.mkdtemp(prefix="idem-bench-rb.")
    results = {}
    loads = [os.getloadavg()[0]]
    stop = threading.Event()
    try:
        harness.stack_up(stack)
        if "delayed" in MODES:
            threading.Thread(target=delay_proxy, args=(stop,), daemon=True).start()
        for mode in MODES:
            for threads in (THREADS, 1):
                per = {w: [] for w in WAYS}
                for rnd in range(ROUNDS):
                    order = WAYS[rnd % len(WAYS):] + WAYS[:rnd % len(WAYS)]
                    if rnd % 2:
                        order = order[::-1]
                    for w in order:
                        per[w].append(measure(mode, w, threads))
                        print(f"[bench] {mode:9s} threads={threads} {w:12s} round {rnd + 1}: "
                              f"{per[w][-1][0]:8.1f}/s", file=sys.stderr, flush=True)
                results[(mode, threads)] = per
                loads.append(os.getloadavg()[0])
    finally:
        stop.set()
        harness.stack_down(stack)
        lock.close()
    write(results, loads)


def write(results, loads):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ruby = subprocess.run(["ruby", "-rpg", "-e", "print RUBY_VERSION, ' ', PG::VERSION"], stdout=subprocess.PIPE,
                          text=True).stdout
    L = ["# Ruby client: round trips, the middleware against a bare transactional handler (same run)", "",
         f"- date: {now}; Ruby and ruby-pg {ruby}; {os.cpu_count()} cores shared with other work (load average "
         f"{min(loads):.1f}-{max(loads):.1f} during the run), every Ruby process at nice 10",
         f"- `bench/clients/ruby_roundtrips.py` (BENCH_ROUNDS={ROUNDS} BENCH_SECONDS={SECONDS:g} "
         f"BENCH_THREADS={THREADS} BENCH_MODES={','.join(MODES)}"
         + (f" BENCH_DELAY_MS={DELAY * 1000:g}" if "delayed" in MODES else "") + "); in process (`bench/clients/ruby_roundtrips.rb`), threads on an "
         "`IdempotencyPg::Pool` of as many connections, a fresh key per request; each figure the median of the "
         "rounds' operations/s, the order rotated every round and reversed every other", "",
         "| mode | threads | way | round trips | median ops/s | / bare-tx | / mw-plain | client CPU ms/op | rounds |",
         "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for (mode, threads), per in results.items():
        med = {w: statistics.median(r[0] for r in per[w]) for w in WAYS}
        for w in WAYS:
            cpu = statistics.median(r[1] for r in per[w])
            L.append(f"| {mode} | {threads} | {w} | {TRIPS[w]} | {med[w]:.0f} | {med[w] / med['bare-tx']:.2f} | "
                     f"{med[w] / med['mw-plain']:.2f} | {cpu:.2f} | " + ", ".join(f"{r[0]:.0f}" for r in per[w])
                     + " |")
    with open(OUT, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
