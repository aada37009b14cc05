"""Requests/s of each client service: POST /payments (the idempotency middleware, a fresh key per request)
against POST /payments-unprotected (the same handler without it), straight to PostgreSQL and through PgBouncer.

Run by bench/clients/run.sh. The four configurations of a service are measured in the same run, in rounds
whose order rotates, and each is reported as the median over the rounds. Loopback only.
"""

import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import uuid
import fcntl

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "clients", "e2e"))
import harness  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "16"))
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
LANGS = [l for l in os.environ.get("BENCH_LANGS", "go,node,python").split(",") if l]
OUT = os.environ.get("BENCH_OUT", os.path.join(HERE, "RESULTS.md"))
CONFIGS = [("direct", "/payments"), ("direct", "/payments-unprotected"),
           ("pgbouncer", "/payments"), ("pgbouncer", "/payments-unprotected")]


def wrk(base, path):
    runid = "b" + uuid.uuid4().hex[:12]
    cmd = ["wrk", "-t", str(THREADS), "-c", str(CONNECTIONS), "-d", f"{SECONDS}s", "--timeout", "5s",
           "-s", os.path.join(HERE, "keys.lua"), base + path, "--", runid]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=SECONDS + 30)
    m = re.search(r"Requests/sec:\s+([0-9.]+)", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed: {r.stdout}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", r.stdout)
    total = re.search(r"(\d+) requests in", r.stdout)
    errs = re.search(r"Socket errors: (.*)", r.stdout)
    return {"rps": float(m.group(1)), "non2xx": int(bad.group(1)) if bad else 0,
            "requests": int(total.group(1)) if total else 0, "socket_errors": errs.group(1) if errs else ""}


def machine():
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.release()}; shared and noisy"


def main():
    lock = open("/tmp/idempotency-clients-e2e.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    stack = tempfile.mkdtemp(prefix="idem-bench-clients.")
    results = {}  # lang -> {(mode, path): [round dicts]}
    problems = []
    try:
        harness.stack_up(stack)
        for lang in LANGS:
            if not harness.service_present(lang):
                problems.append(f"{lang}: clients/{lang} is missing")
                continue
            svcs = {}
            try:
                for mode in harness.MODES:
                    svcs[mode] = harness.Service(stack, lang, mode).start()
            except harness.HarnessError as e:
                print(f"[bench] {lang}: {e}", file=sys.stderr, flush=True)
                problems.append(f"{lang}: " + " / ".join(l.strip() for l in str(e).splitlines() if l.strip())[:600])
                for s in svcs.values():
                    s.stop()
                continue
            per = {c: [] for c in CONFIGS}
            try:
                for c in CONFIGS:  # warm-up: pools filled, code paths hot
                    wrk_short(svcs[c[0]].base, c[1])
                for rnd in range(ROUNDS):
                    order = CONFIGS[rnd % len(CONFIGS):] + CONFIGS[:rnd % len(CONFIGS)]
                    if rnd % 2:
                        order = order[::-1]
                    for mode, path in order:
                        res = wrk(svcs[mode].base, path)
                        per[(mode, path)].append(res)
                        print(f"[bench] {lang} {mode:9s} {path:22s} round {rnd + 1}: {res['rps']:8.1f} req/s"
                              f" (non-2xx {res['non2xx']})", file=sys.stderr, flush=True)
                        if res["non2xx"]:
                            problems.append(f"{lang} {mode} {path} round {rnd + 1}: {res['non2xx']} non-2xx "
                                            f"answers of {res['requests']}")
            except Exception as e:  # noqa: BLE001
                problems.append(f"{lang}: {e}")
            finally:
                for s in svcs.values():
                    s.stop()
            results[lang] = per
    finally:
        harness.stack_down(stack)
        lock.close()
    write(results, problems)
    return 0 if results and not problems else 1


def wrk_short(base, path):
    global SECONDS
    saved, SECONDS = SECONDS, 1
    try:
        wrk(base, path)
    finally:
        SECONDS = saved


def med(rounds):
    return statistics.median(r["rps"] for r in rounds) if rounds else float("nan")


def write(results, problems):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = (f"bench/clients/run.sh   (BENCH_ROUNDS={ROUNDS} BENCH_SECONDS={SECONDS} "
           f"BENCH_CONNECTIONS={CONNECTIONS} BENCH_THREADS={THREADS})")
    L = ["# Client services: the cost of the idempotency middleware, and of PgBouncer", "",
         f"- date: {now}",
         f"- machine: {machine()}",
         f"- command: `{cmd}`",
         f"- load: `wrk -t{THREADS} -c{CONNECTIONS} -d{SECONDS}s -s bench/clients/keys.lua` on 127.0.0.1, a fresh "
         "`Idempotency-Key` on every request (so every request claims, debits, completes); the unprotected endpoint "
         "gets the same request and ignores the key",
         f"- {ROUNDS} rounds of the four configurations of a service, the order rotated (and reversed every other "
         "round) so drift hits all four alike; each figure is the median requests/s over the rounds",
         "- the service, PostgreSQL 15 (fsync off), PgBouncer 1.18 (transaction pooling, pool size 20) and wrk share "
         "the 2 cores: the numbers compare configurations of one run, not machines", "",
         "## Ratios", "",
         "| service | middleware / unprotected, direct | middleware / unprotected, PgBouncer "
         "| PgBouncer / direct, /payments | PgBouncer / direct, unprotected |",
         "|---|---:|---:|---:|---:|"]
    for lang, per in results.items():
        dm, du = med(per[CONFIGS[0]]), med(per[CONFIGS[1]])
        bm, bu = med(per[CONFIGS[2]]), med(per[CONFIGS[3]])
        L.append(f"| {lang} | {dm / du:.2f} | {bm / bu:.2f} | {bm / dm:.2f} | {bu / du:.2f} |")
    L += ["", "## Requests/s (median, then each round)", "",
          "| service | mode | endpoint | median req/s | rounds |", "|---|---|---|---:|---|"]
    for lang, per in results.items():
        for (mode, path) in CONFIGS:
            rs = per[(mode, path)]
            L.append(f"| {lang} | {mode} | `POST {path}` | {med(rs):.0f} | "
                     + ", ".join(f"{r['rps']:.0f}" for r in rs) + " |")
    if problems:
        L += ["", "## Problems in this run", ""] + [f"- {p}" for p in problems]
    L.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    sys.exit(main())
