#!/usr/bin/python3
"""Server instructions per request through the real sample services over HTTP (issue 30, item 5). As root, after
`make install` into $PG_BIN's PostgreSQL:

    bench/clients/http_instructions.py                      every service of SERVICES, N = 500 (~1.5 min)
    HTTP_INSTR_MODE=pgbouncer HTTP_INSTR_SERVICES=go,python bench/clients/http_instructions.py

bench/instructions.sh's method with a service in front: the postmaster runs under callgrind; a run starts the
service as clients/e2e/harness.py does, with one pool connection, sends COUNT requests one after the other on one
keep-alive HTTP connection, stops the service and reads the count of the backend that served it (it exits with
the run; the run's largest backend). Per request = (run of N + 50 - run of 50) / N: connection start-up, the
service's start-up statements and first executions cancel out. Kinds: bare = the service's own
`POST /payments-unprotected`; protected = `POST /payments` with a new key; replay = the full protected run's keys
again. Settings as bench/instructions.sh (fsync, synchronous_commit, autovacuum, full-page writes off).

HTTP_INSTR_MODE=pgbouncer: through PgBouncer (transaction pooling, one server connection, started per run). Go
sees the pooler at start and sends everything unprepared; Node.js and Python name their statements until a 26000
or 42P05 says a pooler moved them, which one server connection never does: so each run sends one request, has
the backend terminated (PgBouncer then opens another, as when it moves a client) and counts from there, after
the fallback to unnamed statements, as under a pooler with many server connections.
"""

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "clients", "e2e"))
import harness  # noqa: E402

N = int(os.environ.get("HTTP_INSTR_N", "500"))
MODE = os.environ.get("HTTP_INSTR_MODE", "direct")
# name -> (harness.SERVICES name, label, environment for one pool connection; Go's: pool_max_conns=1 in the URL)
SERVICES = {
    "go": ("go", "Go net/http (pgx)", {}),
    "node": ("node", "Node.js Express (node-postgres), as started by default", {"PG_POOL_MAX": "1"}),
    "node-plain": ("node", "Node.js Express, `PG_PIPELINE=0` (a plain pool: one statement per round trip)",
                   {"PG_POOL_MAX": "1", "PG_PIPELINE": "0"}),
    "python": ("python", "Python WSGI (psycopg)", {"POOL_SIZE": "1", "THREADS": "1"}),
    "python-fastapi": ("python-fastapi", "Python FastAPI (psycopg async)", {"POOL_SIZE": "1"}),
    "java": ("java", "Java Servlet filter on Tomcat 10.1 (pgjdbc)", {"PG_POOL_MAX": "1"}),
    "ruby-sinatra": ("ruby-sinatra", "Ruby Rack middleware, Sinatra on unicorn (ruby-pg, `PgBackend`)",
                     {"WORKERS": "1", "POOL_SIZE": "1"}),
    "ruby-rails": ("ruby-rails", "Ruby Rack middleware, Rails 6.1 on unicorn (`ActiveRecordBackend`)",
                   {"WORKERS": "1", "POOL_SIZE": "1"}),
}
CHOSEN = [s for s in os.environ.get("HTTP_INSTR_SERVICES", ",".join(SERVICES)).split(",") if s]
PG_BIN = os.environ["PG_BIN"]
PORT = int(os.environ.get("HTTP_INSTR_PORT", os.environ.get("IDEM_PORT_BASE", "55434")))
BOUNCER_PORT = harness.BOUNCER_PORT  # the e2e stack's, unused while this runs
BODY = b'{"amount_cents": 500, "currency": "EUR"}'


def sh(script, *args):
    subprocess.run(["bash", "-c", 'source "$1/scripts/lib/cluster.sh"; shift; ' + script, "_", REPO, *args], check=True)


def psql(d, sql, db="payments"):
    subprocess.run([f"{PG_BIN}/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", d, "-p", str(PORT), "-U", "postgres",
                    "-d", db, *sql], check=True, stdout=subprocess.DEVNULL)


def pid_in(path):
    """The process id written in path, or None while the file is missing or still empty."""
    try:
        text = open(path).read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def request(c, kind, key):
    h = {"Authorization": "Bearer acct_bench", "Content-Type": "application/json"}
    if kind != "bare":
        h["Idempotency-Key"] = json.dumps(key)
    c.request("POST", "/payments-unprotected" if kind == "bare" else "/payments", BODY, h)
    r = c.getresponse()
    body = r.read()
    replayed = r.getheader("Idempotent-Replayed") == "true"
    if r.status != 201 or replayed != (kind == "replay"):
        raise SystemExit(f"{kind} {key}: {r.status} replayed={replayed} {body[:300]!r}")


class Bench:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="idem-http-instr.")
        os.chmod(self.dir, 0o755)
        self.stack, self.cg, self.bdir = (os.path.join(self.dir, d) for d in ("stack", "cg", "pgbouncer"))
        for d in ("bin", "logs"):
            os.makedirs(os.path.join(self.stack, d))
        self.postmaster = None

    def start(self):
        sh('init_cluster "$1" "$2" "shared_preload_libraries = \'idempotency\'" "autovacuum = off" '
           '"synchronous_commit = off" "full_page_writes = off" "wal_init_zero = off" "checkpoint_timeout = 1h" '
           '"max_wal_size = 10GB" && cluster_ctl "$1" start', self.dir, str(PORT))
        psql(self.dir, ["-c", "CREATE DATABASE payments"], db="postgres")
        psql(self.dir, ["-c", "CREATE EXTENSION idempotency", "-f", os.path.join(REPO, "clients", "schema.sql"),
                        "-c", "VACUUM ANALYZE"])
        sh('cluster_ctl "$1" stop', self.dir)
        os.makedirs(self.cg)
        subprocess.run(["chown", "postgres", self.cg], check=True)
        subprocess.run(["su", "postgres", "-c", f"valgrind --tool=callgrind --callgrind-out-file={self.cg}/cg.%p "
                        f"{PG_BIN}/postgres -D {self.dir}/data >{self.dir}/server.log 2>&1 &"], check=True)
        for _ in range(300):
            if subprocess.run([f"{PG_BIN}/pg_isready", "-q", "-h", self.dir, "-p", str(PORT)]).returncode == 0:
                break
            time.sleep(1)
        self.postmaster = int(open(f"{self.dir}/data/postmaster.pid").readline())
        time.sleep(2)
        self.base_children = self.children()
        os.makedirs(self.bdir)
        open(f"{self.bdir}/userlist.txt", "w").write('"postgres" ""\n')
        open(f"{self.bdir}/pgbouncer.ini", "w").write(
            f"[databases]\npayments = host=127.0.0.1 port={PORT} dbname=payments user=postgres\n[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {BOUNCER_PORT}\nunix_socket_dir =\nauth_type = trust\n"
            f"auth_file = {self.bdir}/userlist.txt\npool_mode = transaction\ndefault_pool_size = 1\n"
            f"ignore_startup_parameters = extra_float_digits,search_path,options\n"
            f"logfile = {self.bdir}/pgbouncer.log\npidfile = {self.bdir}/pgbouncer.pid\n")
        subprocess.run(["chown", "-R", "postgres", self.bdir], check=True)

    def stop(self):
        if self.postmaster:
            subprocess.run(["su", "postgres", "-c", f"{PG_BIN}/pg_ctl -D {self.dir}/data -m fast -t 300 stop"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while harness._alive(self.postmaster):  # callgrind writes its file after pg_ctl saw it go
                time.sleep(0.1)
        subprocess.run(["rm", "-rf", self.dir])

    def children(self):
        return len(subprocess.run(["pgrep", "-P", str(self.postmaster)], stdout=subprocess.PIPE).stdout.split())

    def wait_backends(self):
        for _ in range(600):
            if self.children() <= self.base_children:
                return
            time.sleep(0.1)

    def run(self, svc, kind, keys):
        """The instructions of the backend that served one run of len(keys) requests."""
        before, bouncer = set(os.listdir(self.cg)), None
        port = PORT
        if MODE == "pgbouncer":
            subprocess.run(["runuser", "-u", "postgres", "--", "pgbouncer", "-d", "-q", f"{self.bdir}/pgbouncer.ini"],
                           check=True, cwd=self.bdir)
            # (The pid file exists before its number is written.)
            while not (harness.port_open(BOUNCER_PORT) and pid_in(f"{self.bdir}/pgbouncer.pid")):
                time.sleep(0.05)
            bouncer, port = pid_in(f"{self.bdir}/pgbouncer.pid"), BOUNCER_PORT
        base, _, env = SERVICES[svc]
        url = f"postgresql://postgres@127.0.0.1:{port}/payments" + ("?pool_max_conns=1" if base == "go" else "")
        s = harness.Service(self.stack, base, MODE, extra_env=dict(env, DATABASE_URL=url))
        s.start(timeout=120)
        try:
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
            if MODE == "pgbouncer":
                request(c, kind, keys[0] + "x" if kind == "protected" else keys[0])
                psql(self.dir, ["-c", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = 'payments' AND pid <> pg_backend_pid()"])
                self.wait_backends()
            for key in keys:
                request(c, kind, key)
            c.close()
        finally:
            s.stop()
            if bouncer:
                os.kill(bouncer, 15)
                while harness._alive(bouncer):
                    time.sleep(0.05)
        self.wait_backends()
        # The served backend's file can appear a moment after the backend is gone (seen on a loaded machine): wait
        # for it, so that it is not counted in the next run instead.
        for _ in range(100):
            if set(os.listdir(self.cg)) - before:
                break
            time.sleep(0.1)
        best = 0
        for f in set(os.listdir(self.cg)) - before:
            for _ in range(100):
                text = open(os.path.join(self.cg, f)).read()
                if "\nsummary:" in text:
                    break
                time.sleep(0.1)
            best = max([best] + [int(l.split()[1]) for l in text.splitlines() if l.startswith("summary:")])
        return best

    def per_request(self, svc, kind, key):
        """(run of N + 50 - run of 50) / N, after a run of 5 (the first executions, once); key(run, i)."""
        self.run(svc, kind, [key("w", i) for i in range(5)])
        small = self.run(svc, kind, [key("s", i) for i in range(50)])
        return (self.run(svc, kind, [key("f", i) for i in range(N + 50)]) - small) / N


def main():
    b, rows = Bench(), []
    try:
        b.start()
        for svc in CHOSEN:
            p = {"bare": b.per_request(svc, "bare", lambda r, i: None),
                 "protected": b.per_request(svc, "protected", lambda r, i: f"{svc}-{MODE}-{r}{i}")}
            psql(b.dir, ["-c", "VACUUM"])  # hint bits set, as for bench/instructions.sh's loaded keys
            p["replay"] = b.per_request(svc, "replay", lambda r, i: f"{svc}-{MODE}-f{i}")
            rows.append((svc, p))
            print(f"{svc} {MODE} N={N} " + " ".join(f"{k}={v:.0f}" for k, v in p.items()), flush=True)
    finally:
        b.stop()
    k = lambda v: f"{v / 1000:.0f}k"  # noqa: E731
    print(f"\n| service ({MODE}, N = {N}) | bare handler | protected | replay | added by the middleware |")
    print("|---|---:|---:|---:|---:|")
    for svc, p in rows:
        print(f"| {SERVICES[svc][1]} | {k(p['bare'])} | {k(p['protected'])} ({p['protected'] / p['bare']:.2f}x) | "
              f"{k(p['replay'])} ({p['replay'] / p['bare']:.2f}x) | {k(p['protected'] - p['bare'])} |")


if __name__ == "__main__":
    main()
