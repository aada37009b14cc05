"""Round trips of the Node.js middleware (issue 25 item 4), in one run: requests/s of POST /payments with
BEGIN + claim and complete + COMMIT pipelined ('pipeline', the sample service's default: a pool with pipeline:
true) and one statement at a time ('plain', PG_PIPELINE=0: five round trips), against the bare transactional
handler (POST /payments-unprotected: BEGIN, the same INSERT, COMMIT, same driver and pool) and the unprotected
autocommit handler (POST /payments-autocommit: the INSERT alone), straight to PostgreSQL and through PgBouncer.
Rounds rotate the order; each figure is the median over the rounds. (Until 1.3 the default was one
multi-statement message; that path is gone.)

As root (the stack runs PostgreSQL as postgres): /usr/bin/python3 bench/clients/node_roundtrips.py
Knobs: BENCH_ROUNDS (3), BENCH_SECONDS (5), BENCH_CONNECTIONS (8), BENCH_THREADS (2),
BENCH_OUT (bench/clients/RESULTS-node.md).
"""

import datetime
import fcntl
import os
import sys
import tempfile

os.environ.setdefault("BENCH_CONNECTIONS", "8")
os.environ.setdefault("BENCH_OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS-node.md"))
import bench  # noqa: E402  (wrk, med, machine, harness; reads the knobs above)
from bench import harness  # noqa: E402

VARIANTS = {  # name -> (service env, path)
    "middleware pipeline": ({}, "/payments"),
    "middleware plain (5 trips)": ({"PG_PIPELINE": "0"}, "/payments"),
    "bare transactional": ({}, "/payments-unprotected"),
    "autocommit": ({}, "/payments-autocommit"),
}
ENVS = {"pipeline": {}, "plain": {"PG_PIPELINE": "0"}}


def env_name(env):
    return next(k for k, v in ENVS.items() if v == env)


def main():
    lock = open("/tmp/idempotency-clients-e2e.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    stack = tempfile.mkdtemp(prefix="idem-bench-node.")
    results = {}
    problems = []
    svcs = {}
    try:
        harness.stack_up(stack)
        port = 55500
        for mode in harness.MODES:
            for name, env in ENVS.items():
                svcs[(mode, name)] = harness.Service(stack, "node", mode, port=port,
                                                     extra_env={**env, "PAYMENTS_BENCH": "1"}).start()
                port += 1
        configs = [(mode, v) for mode in harness.MODES for v in VARIANTS]
        for mode, v in configs:  # warm-up
            env, path = VARIANTS[v]
            bench.wrk_short(svcs[(mode, env_name(env))].base, path)
        results = {c: [] for c in configs}
        for rnd in range(bench.ROUNDS):
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            if rnd % 2:
                order = order[::-1]
            for mode, v in order:
                env, path = VARIANTS[v]
                res = bench.wrk(svcs[(mode, env_name(env))].base, path)
                results[(mode, v)].append(res)
                print(f"[bench] {mode:9s} {v:26s} round {rnd + 1}: {res['rps']:8.1f} req/s (non-2xx {res['non2xx']})",
                      file=sys.stderr, flush=True)
                if res["non2xx"]:
                    problems.append(f"{mode} {v} round {rnd + 1}: {res['non2xx']} non-2xx of {res['requests']}")
    finally:
        for s in svcs.values():
            s.stop()
        harness.stack_down(stack)
        lock.close()
    lines = [f"# Node.js middleware: round trips ({datetime.date.today()})", "",
             f"- {bench.machine()}",
             f"- `wrk -t{bench.THREADS} -c{bench.CONNECTIONS} -d{bench.SECONDS}s -s bench/clients/keys.lua` (a fresh key "
             f"per request), {bench.ROUNDS} rounds in rotating order, medians of requests/s; service, PostgreSQL 15, "
             "PgBouncer (transaction pooling) and wrk on one machine; pg.Pool max 10; node-postgres 8.23",
             "- produced by `bench/clients/node_roundtrips.py`", ""]
    for mode in harness.MODES:
        bare = bench.med(results[(mode, "bare transactional")])
        auto = bench.med(results[(mode, "autocommit")])
        lines += [f"## {mode}", "", "| handler | req/s (median) | rounds | vs bare transactional | vs autocommit |",
                  "|---|---:|---|---:|---:|"]
        for v in VARIANTS:
            rs = results[(mode, v)]
            m = bench.med(rs)
            lines.append(f"| {v} | {m:.0f} | {', '.join('%.0f' % r['rps'] for r in rs)} | {m / bare:.2f}x | "
                         f"{m / auto:.2f}x |")
        lines.append("")
    if problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in problems] + [""]
    with open(bench.OUT, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
