"""Requests/s of each client service: POST /payments (the idempotency middleware, a fresh key per request) against
POST /payments-unprotected (the same service's bare transactional handler), with fsync on and off, for the code of
this checkout ("after") and, with BENCH_BEFORE, of an older revision ("before"), all in one run per language.

Run by bench/clients/run.sh. Every configuration of a language, {before, after} x {fsync on, off} x {middleware,
bare} (x {direct, PgBouncer} with BENCH_PGBOUNCER=1), is measured in the same run, in rounds. A cell's middleware
and bare measurements run back to back, so each round gives a paired ratio; the cells' order rotates from round to
round and the whole order (so also which of the pair goes first) reverses every other round. Each figure is the
median over the rounds, a ratio the median of the rounds' ratios (as bench/run.sh reports its ratios). Loopback
only.

Knobs (environment):
  BENCH_ROUNDS (3), BENCH_SECONDS (5), BENCH_THREADS (2)  wrk rounds, seconds per measurement, wrk threads
  BENCH_CONNECTIONS (8)   wrk's connections, and each service's pool size (so the database sees at most as many)
  BENCH_LANGS (go,node,python)   one run per language, one after another (also: java, ruby-sinatra, ruby-rails)
  BENCH_FSYNC (both)      on, off or both: switched with ALTER SYSTEM and a reload before each measurement that
                          needs the other setting, then a CHECKPOINT before every measurement
  BENCH_BEFORE (none)     a git revision (b5ec4af is version 1.2): checked out with `git worktree add` into a
                          temporary folder; its extension is built into a copy of the PostgreSQL at PG_BIN (see
                          BENCH_BEFORE_PG) and its services are started by its own clients/e2e/harness.py
  BENCH_BEFORE_PG         where that copy goes (default: the folder holding PG_BIN's usr/, plus "-before"); made
                          with `cp -a` when missing and rebuilt when it holds another revision. PG_BIN must be a
                          relocatable copy (DIR/usr/lib/postgresql/NN/bin): the system's PostgreSQL is never written
  BENCH_PGBOUNCER (0)     1 adds the same configurations through each stack's PgBouncer
  BENCH_OUT (RESULTS.md beside this file)

"After" is this checkout's clients and the extension installed in PG_BIN's PostgreSQL (make install first). The
two stacks use IDEM_E2E_PORT_BASE (55480) .. +49: after's PostgreSQL, PgBouncer and services in the first half,
before's in the second.
"""

import datetime
import fcntl
import importlib.util
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "clients", "e2e"))
import harness  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "8"))
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
LANGS = [l for l in os.environ.get("BENCH_LANGS", "go,node,python").split(",") if l]
FSYNC = {"both": ("on", "off"), "on": ("on",), "off": ("off",)}[os.environ.get("BENCH_FSYNC", "both")]
BEFORE = os.environ.get("BENCH_BEFORE", "")
PGBOUNCER = os.environ.get("BENCH_PGBOUNCER", "0") == "1"
OUT = os.environ.get("BENCH_OUT", os.path.join(HERE, "RESULTS.md"))
PATHS = (("middleware", "/payments"), ("bare", "/payments-unprotected"))
MODES = ("direct", "pgbouncer") if PGBOUNCER else ("direct",)
VERSIONS = ("before", "after") if BEFORE else ("after",)
# Every configuration of a language: (version, fsync, mode, handler)
CELLS = [(v, f, m) for v in VERSIONS for f in FSYNC for m in MODES]
CONFIGS = [cell + (h,) for cell in CELLS for h, _ in PATHS]
SERVICE_LANGS = ("go", "node", "python", "java", "ruby-sinatra", "ruby-rails")


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return r.stdout


# --------------------------------------------------------------------------- the two stacks

class Stack:
    """One version's code: its harness module, its PostgreSQL (PG_BIN) and its ports."""

    def __init__(self, version, h, pg_bin, label):
        self.version, self.h, self.pg_bin, self.label = version, h, pg_bin, label
        self.dir = tempfile.mkdtemp(prefix=f"idem-bench-clients-{version}.")
        self.fsync = None
        self.extversion = "?"

    def _with_pg_bin(self, fn, *args):
        # scripts/lib/cluster.sh reads PG_BIN from the environment the harness passes to bash
        saved = os.environ.get("PG_BIN")
        os.environ["PG_BIN"] = self.pg_bin
        try:
            return fn(*args)
        finally:
            if saved is None:
                del os.environ["PG_BIN"]
            else:
                os.environ["PG_BIN"] = saved

    def up(self):
        self._with_pg_bin(self.h.stack_up, self.dir)
        self.extversion = self.sql("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'",
                                   db=self.h.DB)[0][0]

    def down(self):
        self._with_pg_bin(self.h.stack_down, self.dir)

    def sql(self, q, db="postgres"):
        import psycopg
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.h.PG_PORT}/{db}", autocommit=True) as c:
            cur = c.execute(q)
            return cur.fetchall() if cur.description else None

    def set_fsync(self, value):
        """fsync is a reload setting: every backend, the services' pooled ones too, applies it before its next
        command. A CHECKPOINT follows in measure(), so no measurement inherits another's dirty buffers."""
        if self.fsync == value:
            return
        self.sql(f"ALTER SYSTEM SET fsync = {value}")
        self.sql("SELECT pg_reload_conf()")
        deadline = time.time() + 10
        while self.sql("SHOW fsync")[0][0] != value:
            if time.time() > deadline:
                raise RuntimeError(f"{self.version}: fsync did not become {value} after a reload")
            time.sleep(0.05)
        time.sleep(0.2)  # the postmaster signals its children after it has reloaded itself
        self.fsync = value


def place_ports(h, base, count):
    """Give a harness module the ports base .. base+count-1: PostgreSQL, PgBouncer, then its services."""
    h.PG_PORT, h.BOUNCER_PORT = base, base + 1
    h.DIRECT_URL = f"postgresql://postgres@127.0.0.1:{h.PG_PORT}/{h.DB}"
    h.BOUNCER_URL = f"postgresql://postgres@127.0.0.1:{h.BOUNCER_PORT}/{h.DB}"
    h.FIRST_SERVICE_PORT, h.LAST_SERVICE_PORT = base + 2, base + count - 1
    h.SPARE_PORTS = range(h.FIRST_SERVICE_PORT, h.LAST_SERVICE_PORT + 1)
    h.SERVICE_PORTS = {(lang, mode): base + 2 + 2 * i + j
                       for i, lang in enumerate(SERVICE_LANGS) for j, mode in enumerate(("direct", "pgbouncer"))}


def pg_root(pg_bin):
    """DIR of a relocatable copy DIR/usr/lib/postgresql/NN/bin, or None."""
    parts = os.path.realpath(pg_bin).split(os.sep)
    if len(parts) >= 6 and parts[-1] == "bin" and parts[-3:-2] == ["postgresql"] and parts[-5:-3] == ["usr", "lib"]:
        root = os.sep.join(parts[:-5])
        return root or None
    return None


def prepare_before(rev, workdir):
    """Check rev out into workdir/src and install its extension into a copy of PG_BIN's PostgreSQL; returns
    (the checkout, the copy's bin folder, the full commit)."""
    commit = sh(["git", "-C", REPO, "rev-parse", "--verify", rev + "^{commit}"]).strip()
    src = os.path.join(workdir, "src")
    sh(["git", "-C", REPO, "worktree", "add", "--detach", src, commit])
    pg_bin = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
    root = pg_root(pg_bin)
    if root is None:
        raise RuntimeError(f"BENCH_BEFORE needs PG_BIN in a relocatable copy (DIR/usr/lib/postgresql/NN/bin), not "
                           f"{pg_bin}: the old extension is installed into a copy of it")
    dest = os.environ.get("BENCH_BEFORE_PG") or root.rstrip("/") + "-before"
    rel_bin = os.path.relpath(os.path.realpath(pg_bin), os.path.realpath(root))
    dest_bin = os.path.join(dest, rel_bin)
    marker = os.path.join(dest, ".idem-bench-before")
    if os.path.exists(marker) and open(marker).read().strip() == commit:
        log(f"before: {dest} already holds the extension of {commit[:7]}")
        return src, dest_bin, commit
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    log(f"before: copying {root} to {dest}, building the extension of {commit[:7]} into it")
    sh(["cp", "-a", root, dest])
    pg_config = os.path.join(dest_bin, "pg_config")
    # only the old version's files: no newer script or library left over from the copied installation
    for d in (sh([pg_config, "--sharedir"]).strip() + "/extension", sh([pg_config, "--pkglibdir"]).strip()):
        for name in os.listdir(d):
            if name.startswith("idempotency"):
                os.unlink(os.path.join(d, name))
    bitcode = os.path.join(sh([pg_config, "--pkglibdir"]).strip(), "bitcode")
    for name in os.listdir(bitcode) if os.path.isdir(bitcode) else ():
        if name.startswith("idempotency"):
            p = os.path.join(bitcode, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    sh(["make", "-s", "-j2", f"PG_CONFIG={pg_config}"], cwd=src)
    sh(["make", "-s", f"PG_CONFIG={pg_config}", "install"], cwd=src)
    with open(marker, "w") as f:
        f.write(commit + "\n")
    return src, dest_bin, commit


def load_harness(checkout, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(checkout, "clients", "e2e", "harness.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def describe(checkout):
    out = subprocess.run(["git", "-C", checkout, "log", "-1", "--format=%h %cs"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout.strip()
    return out or "?"


# --------------------------------------------------------------------------- measuring

def wrk(base, path, seconds=None):
    seconds = seconds or SECONDS
    runid = "b" + uuid.uuid4().hex[:12]
    cmd = ["wrk", "-t", str(THREADS), "-c", str(CONNECTIONS), "-d", f"{seconds}s", "--timeout", "5s",
           "-s", os.path.join(HERE, "keys.lua"), base + path, "--", runid]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds + 30)
    m = re.search(r"Requests/sec:\s+([0-9.]+)", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed: {r.stdout}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", r.stdout)
    total = re.search(r"(\d+) requests in", r.stdout)
    errs = re.search(r"Socket errors: (.*)", r.stdout)
    return {"rps": float(m.group(1)), "non2xx": int(bad.group(1)) if bad else 0,
            "requests": int(total.group(1)) if total else 0, "socket_errors": errs.group(1) if errs else ""}


def wrk_short(base, path):
    """A one-second run (a warm-up; bench/clients/*_roundtrips.py)."""
    return wrk(base, path, seconds=1)


def pool_env(h, lang, mode):
    """The service's pool at CONNECTIONS connections (pgxpool's default is max(4, cores))."""
    if lang == "go":
        return {"DATABASE_URL": h.database_url(mode) + f"?pool_max_conns={CONNECTIONS}"}
    if lang in ("node", "java"):
        return {"PG_POOL_MAX": str(CONNECTIONS)}
    if lang.startswith("ruby"):  # unicorn: a process per request at a time, one connection each
        return {"WORKERS": str(CONNECTIONS), "POOL_SIZE": "1"}
    return {"POOL_SIZE": str(CONNECTIONS)}


def run_lang(lang, stacks, problems):
    svcs = {}
    try:
        for v, st in stacks.items():
            if not st.h.service_present(lang):
                raise RuntimeError(f"{v}: clients/{lang} is missing")
            for mode in MODES:
                log(f"{lang}: starting the {v} service ({mode})")
                svcs[(v, mode)] = st.h.Service(st.dir, lang, mode, extra_env=pool_env(st.h, lang, mode)).start()
    except Exception as e:  # noqa: BLE001 - either harness's HarnessError, or a missing folder
        for s in svcs.values():
            s.stop()
        problems.append(f"{lang}: " + " / ".join(l.strip() for l in str(e).splitlines() if l.strip())[:600])
        return None
    per = {c: [] for c in CONFIGS}
    try:
        for v, st in stacks.items():  # warm-up: pools filled, code paths hot
            for mode in MODES:
                for _, path in PATHS:
                    wrk(svcs[(v, mode)].base, path, seconds=1)
        for rnd in range(ROUNDS):
            k = rnd % len(CELLS)
            order = [cell + (h,) for cell in CELLS[k:] + CELLS[:k] for h, _ in PATHS]
            if rnd % 2:
                order = order[::-1]
            for c in order:
                v, fs, mode, handler = c
                st = stacks[v]
                st.set_fsync(fs)
                st.sql("CHECKPOINT")
                res = wrk(svcs[(v, mode)].base, dict(PATHS)[handler])
                per[c].append(res)
                log(f"{lang} {v:6s} fsync={fs:3s} {mode:9s} {handler:10s} round {rnd + 1}: "
                    f"{res['rps']:8.1f} req/s (non-2xx {res['non2xx']})")
                if res["non2xx"]:
                    problems.append(f"{lang} {v} fsync={fs} {mode} {handler} round {rnd + 1}: {res['non2xx']} "
                                    f"non-2xx answers of {res['requests']}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"{lang}: {e}")
    finally:
        for s in svcs.values():
            s.stop()
    return per


def main():
    started = time.time()
    lock = open(harness.LOCK, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one stack on these ports at a time
    base = harness.PORT_BASE
    place_ports(harness, base, 25)
    work = tempfile.mkdtemp(prefix="idem-bench-clients.")
    stacks, results, problems, loads = {}, {}, [], []
    before_src = None
    try:
        if BEFORE:
            before_src, before_bin, commit = prepare_before(BEFORE, work)
            hb = load_harness(before_src, "harness_before")
            place_ports(hb, base + 25, 24)
            stacks["before"] = Stack("before", hb, before_bin, f"before = {describe(before_src)} (BENCH_BEFORE={BEFORE})")
        stacks["after"] = Stack("after", harness, os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"),
                                f"after = this checkout, {describe(REPO)}")
        stacks = {v: stacks[v] for v in VERSIONS}
        for st in stacks.values():
            st.up()
        for lang in LANGS:
            t0 = time.time()
            loads.append(os.getloadavg()[0])
            per = run_lang(lang, stacks, problems)
            loads.append(os.getloadavg()[0])
            if per is not None:
                results[lang] = per
                log(f"{lang}: {time.time() - t0:.0f} s")
    finally:
        for st in stacks.values():
            try:
                st.down()
            except Exception as e:  # noqa: BLE001
                problems.append(f"stopping the {st.version} stack: {e}")
        if before_src:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", before_src],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            subprocess.run(["git", "-C", REPO, "worktree", "prune"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
        lock.close()
    write(results, problems, stacks, loads, time.time() - started)
    return 0 if results and not problems else 1


# --------------------------------------------------------------------------- the report

def med(rounds):
    return statistics.median(r["rps"] for r in rounds) if rounds else float("nan")


def machine():
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.release()}"


def write(results, problems, stacks, loads, elapsed):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    knobs = (f"BENCH_LANGS={','.join(LANGS)} BENCH_CONNECTIONS={CONNECTIONS} BENCH_ROUNDS={ROUNDS} "
             f"BENCH_SECONDS={SECONDS} BENCH_FSYNC={'both' if len(FSYNC) == 2 else FSYNC[0]}"
             + (f" BENCH_BEFORE={BEFORE}" if BEFORE else "") + (" BENCH_PGBOUNCER=1" if PGBOUNCER else ""))
    L = ["# Client services: the middleware against its own bare handler, before and after", "",
         f"- date: {now}; the whole run took {elapsed / 60:.1f} min",
         f"- machine: {machine()}; load average (1 min) {min(loads, default=0):.1f}-{max(loads, default=0):.1f} "
         "during the run, shared with other work",
         f"- command: `{knobs} bench/clients/run.sh`",
         f"- load: `wrk -t{THREADS} -c{CONNECTIONS} -d{SECONDS}s -s bench/clients/keys.lua` on 127.0.0.1, a fresh "
         "`Idempotency-Key` on every request (so every protected request claims, inserts, completes); the bare "
         "handler (`POST /payments-unprotected`) gets the same request, ignores the key and runs the same "
         f"transactional insert; each service's pool holds {CONNECTIONS} connections",
         "- versions: " + "; ".join(f"{st.label}, extension {st.extversion}" for st in stacks.values()),
         f"- {ROUNDS} rounds of the {len(CONFIGS)} configurations of a language; a cell's middleware and bare "
         "measurements back to back (a paired ratio per round), the cells' order rotated from round to round and "
         "the whole order reversed every other round, so drift hits all alike; fsync switched by reload where "
         "needed and a `CHECKPOINT` before every measurement",
         "- req/s: the median over the rounds; middleware / bare: the median of the rounds' ratios; after / before: "
         "the quotient of those figures", ""]
    for lang, per in results.items():
        L += [f"## {lang}", "",
              "| fsync | mode | version | middleware req/s | bare req/s | middleware / bare | each round's ratio |",
              "|---|---|---|---:|---:|---:|---|"]
        for fs in FSYNC:
            for mode in MODES:
                cell = {}
                for v in VERSIONS:
                    mws, bares = per[(v, fs, mode, "middleware")], per[(v, fs, mode, "bare")]
                    ratios = [m["rps"] / b["rps"] for m, b in zip(mws, bares)]
                    cell[v] = (med(mws), med(bares), statistics.median(ratios) if ratios else float("nan"))
                    L.append(f"| {fs} | {mode} | {v} | {cell[v][0]:.0f} | {cell[v][1]:.0f} | {cell[v][2]:.2f} | "
                             + ", ".join(f"{r:.2f}" for r in ratios) + " |")
                if "before" in cell:
                    a, b = cell["after"], cell["before"]
                    L.append(f"| {fs} | {mode} | after / before | {a[0] / b[0]:.2f} | {a[1] / b[1]:.2f} "
                             f"| {a[2] / b[2]:.2f} | |")
        L.append("")
    L += ["## Every round (req/s)", "", "| service | version | fsync | mode | handler | median | rounds |",
          "|---|---|---|---|---|---:|---|"]
    for lang, per in results.items():
        for c in CONFIGS:
            rs = per[c]
            L.append(f"| {lang} | {' | '.join(c)} | {med(rs):.0f} | " + ", ".join(f"{r['rps']:.0f}" for r in rs)
                     + " |")
    if problems:
        L += ["", "## Problems in this run", ""] + [f"- {p}" for p in problems]
    L.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    sys.exit(main())
