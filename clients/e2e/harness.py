"""The shared harness for the client services of clients/CONTRACT.md.

A stack is a throwaway PostgreSQL 15 cluster (scripts/lib/cluster.sh) with the database `payments`,
`CREATE EXTENSION idempotency` and clients/schema.sql, for the e2e suite its sessions under DB_SETTINGS
(bytea_output = escape, DateStyle = 'SQL, DMY', ...: ALTER DATABASE), plus PgBouncer in transaction pooling mode.
Both listen on loopback only, on ports IDEM_E2E_PORT_BASE (55480) .. +49, by default:

    55480  PostgreSQL            55481  PgBouncer
    55482..55529  the services of SERVICES, each once direct and once through PgBouncer (two ports each, in
                  the table's order; a port found taken is swapped for a spare one of that range)

Used by conftest.py (pytest) and bench/clients/bench.py as a module, and by clients/run-tests.sh through its
command line:

    python3 harness.py stack-up DIR      start the cluster and PgBouncer in DIR, print shell variables
    python3 harness.py createdb NAME     another database like `payments` (without DB_SETTINGS) in the running
                                         stack, print its URL
    python3 harness.py stack-down DIR    stop every process recorded in DIR (services too) and remove DIR

IDEM_E2E_EDITION=managed: the stack is the managed edition's (issue 40) instead: a cluster that loads no library of
this extension (no shared_preload_libraries, no CREATE EXTENSION), every database given dist/idempotency-managed.sql
(the plain script, generated afresh from managed/ into the stack folder) before clients/schema.sql. PG_BIN (the
server's bin directory, Debian's 15 by default) is the PostgreSQL it runs, as for scripts/lib/cluster.sh.
"""

import contextlib
import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.dirname(HERE)
REPO = os.path.dirname(CLIENTS)

# IDEM_E2E_PORT_BASE moves the whole range (base .. base+49), so two checkouts can each run a stack at once.
PORT_BASE = int(os.environ.get("IDEM_E2E_PORT_BASE", "55480"))
LOCK = f"/tmp/idempotency-clients-e2e-{PORT_BASE}.lock"
PG_PORT = PORT_BASE
BOUNCER_PORT = PORT_BASE + 1
DB = "payments"
DIRECT_URL = f"postgresql://postgres@127.0.0.1:{PG_PORT}/{DB}"
BOUNCER_URL = f"postgresql://postgres@127.0.0.1:{BOUNCER_PORT}/{DB}"
MODES = ("direct", "pgbouncer")
RIDES_LEASE_SECONDS = 2  # POST /rides' lease in the e2e suite (CONTRACT.md "lease-rides"), so takeovers are quick
# Session settings that another role can choose (ALTER DATABASE payments SET, by stack_up when given them: the e2e
# suite's stack, conftest.py, and `harness.py stack-up`, clients/run-tests.sh's): every service runs under them,
# direct and through PgBouncer, and must answer as under the defaults (CONTRACT.md "session-settings": nothing is
# read back as text these change). IDEM_E2E_DB_SETTINGS=default runs the suite under the server's defaults; the
# benchmarks' stacks (bench/clients, stack_up(dir)) always are, to measure the usual case.
# The edition the stack's databases get: "c" (CREATE EXTENSION idempotency, the library preloaded) or "managed" (the
# plain script of the managed edition, no library loaded).
EDITION = os.environ.get("IDEM_E2E_EDITION", "c")
if EDITION not in ("c", "managed"):
    raise SystemExit(f"harness.py: IDEM_E2E_EDITION must be c or managed, not {EDITION!r}")
PG_BIN = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
_managed_script = None  # the plain script written for this stack (stack_up)
DB_SETTINGS = {} if os.environ.get("IDEM_E2E_DB_SETTINGS") == "default" else {
    "bytea_output": "escape", "DateStyle": "SQL, DMY", "IntervalStyle": "sql_standard", "TimeZone": "Asia/Kolkata",
    "extra_float_digits": "0"}

# How each language's service is started: the one table to fix when a service moves.
#   dir      folder under clients/ (the working directory of every command)
#   ready    a file (relative to dir) that must exist before the service can start: its absence means "not there yet"
#   prepare_if_missing  (path, commands): run first when path (relative to dir) does not exist
#   prepare  commands run once per harness run before the first start; {bin} is a scratch folder of the stack
#   prepare_env  environment added for the prepare commands
#   argv     the service's command line; env: added to PORT, DATABASE_URL, PAYMENTS_FAULTS=1
# prepare_if_missing, prepare, prepare_env and env may be left out.
# A name is a language, its reference service, or "<language>-<framework>", the small app of one framework
# adapter; every check of test_e2e.py runs against every one. Its ports follow from its place in the table.


def _python(ready, argv, **env):
    """A service of clients/python run from the sources: `python3 -m ARGV` once src/payments_service/READY exists."""
    return {"dir": "python", "ready": "src/payments_service/" + ready, "argv": ["/usr/bin/python3", "-m"] + argv,
            "env": dict(PYTHONPATH="src", **env)}


SERVICES = {
    "go": {
        "dir": "go",
        "ready": "cmd/payments",
        # vendor/ from Debian's golang-*-dev sources (clients/go/debian-vendor.sh, rewritten every time so a
        # go.mod change is picked up), then an offline build
        "prepare": [["sh", "debian-vendor.sh"], ["go", "build", "-o", "{bin}/payments-go", "./cmd/payments"]],
        "prepare_env": {"GOFLAGS": "-mod=vendor", "GOPROXY": "off", "GOTOOLCHAIN": "local", "GO111MODULE": "on"},
        "argv": ["{bin}/payments-go"],
    },
    "node": {
        "dir": "node",
        "ready": "service/server.js",
        "prepare_if_missing": ("node_modules", [["npm", "ci", "--no-audit", "--no-fund"]]),
        "argv": ["node", "service/server.js"],
    },
    "python": _python("__main__.py", ["payments_service"]),
    # FastAPI (Starlette, ASGI) under uvicorn, psycopg 3's async connection (idempotency_pg.asgi.PsycopgBackend)
    "python-fastapi": _python("asgi_main.py", ["payments_service.asgi_main", "psycopg"], POOL_SIZE="10"),
    # FastAPI with a SQLAlchemy 1.4 Session on psycopg2, ORM writes (idempotency_pg.asgi.SQLAlchemyBackend)
    "python-sqlalchemy": _python("asgi_main.py", ["payments_service.asgi_main", "sqlalchemy"], POOL_SIZE="10"),
    # Django 3.2 under waitress, the claim inside transaction.atomic() (idempotency_pg.django.idempotent)
    "python-django": _python("django_app.py", ["payments_service.django_app"], THREADS="10"),
    # The Servlet filter on embedded Tomcat 10.1 (clients/java: mvn -o package, offline against Debian's Maven
    # repository), one JVM per service started, small and with the quick JIT only (a 2-core machine runs many)
    "java": {
        "dir": "java",
        "ready": "payments/pom.xml",
        "prepare": [["mvn", "-q", "-o", "-s", "settings.xml", "package", "-DskipTests"]],
        "argv": ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
                 "-jar", "payments/target/idempotency-payments-1.4.0.jar"],
    },
    # Ruby: the Rack middleware (clients/ruby) in a Sinatra app under unicorn, a `pg` connection per worker
    "ruby-sinatra": {"dir": "ruby", "ready": "service/serve", "argv": ["sh", "service/serve", "sinatra"]},
    # Rails 6.1 (API app): the same middleware with ActiveRecordBackend, the controller writing with its models
    "ruby-rails": {"dir": "ruby", "ready": "service/rails_app.rb", "argv": ["sh", "service/serve", "rails"]},
}

# The sample services run from the clients' packages as users install them (clients/package.sh install): the wheel
# in a fresh virtualenv, the npm tarball in a fresh Node.js project, the Go module vendored into a fresh module, the
# Java filter's jar installed into a fresh local Maven repository and the sample built against it. A
# file a package leaves out fails these services while the ones above, run from the sources, pass. One build and
# install for the three (the same prepare command).
for _name, _serve in (("python-wheel", "python/serve"), ("node-tarball", "node/serve"), ("go-module", "go/payments"),
                      ("java-jar", "java/serve"), ("ruby-gem", "ruby/serve")):
    SERVICES[_name] = {"dir": ".", "ready": "package.sh", "argv": ["{bin}/artifacts/" + _serve],
                       "prepare": [["bash", "package.sh", "install", "{bin}/artifacts"]]}
# The Go service on each framework adapter (PAYMENTS_FRAMEWORK; "go" above is net/http): the same binary, built
# once (prepare_service runs a list of commands once per stack, whichever service asks first).
for _fw in ("chi", "echo", "gin"):
    SERVICES["go-" + _fw] = dict(SERVICES["go"], env={"PAYMENTS_FRAMEWORK": _fw})

# The one place where a CONTRACT.md rule that cannot apply to a service says why: (service, rule) -> reason. The
# checks of that rule (marked @pytest.mark.rule("<rule>") in test_e2e.py) are then skipped with the reason; every
# other service passes every rule.
NOT_APPLICABLE = {}

LANGS = tuple(SERVICES)
FIRST_SERVICE_PORT, LAST_SERVICE_PORT = PORT_BASE + 2, PORT_BASE + 49
SERVICE_PORTS = {(name, mode): FIRST_SERVICE_PORT + 2 * i + j
                 for i, name in enumerate(SERVICES) for j, mode in enumerate(MODES)}
if max(SERVICE_PORTS.values()) > LAST_SERVICE_PORT:
    raise SystemExit(f"harness.py: {len(SERVICES)} services need more ports than {FIRST_SERVICE_PORT}-{LAST_SERVICE_PORT}")


class HarnessError(Exception):
    pass


def log(msg):
    print(f"[harness] {msg}", file=sys.stderr, flush=True)


def service_dir(lang):
    return os.path.join(CLIENTS, SERVICES[lang]["dir"])


def service_present(lang):
    """The language folder exists: from then on the service is expected to work."""
    return os.path.isdir(service_dir(lang))


def port_open(port, host="127.0.0.1"):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def port_bindable(port, host="127.0.0.1"):
    """A server that does not set SO_REUSEADDR can listen here: nothing listens, and no socket of an outgoing
    connection (the ephemeral range covers these ports) holds the port, not even in TIME_WAIT."""
    with socket.socket() as s, contextlib.suppress(OSError):
        s.bind((host, port))
        return True
    return False


_ports_in_use = set()  # ports of the services this process runs


def pick_port(preferred):
    for p in [preferred, *range(FIRST_SERVICE_PORT, LAST_SERVICE_PORT + 1)]:
        if p not in _ports_in_use and port_bindable(p):
            return p
    raise HarnessError(f"no free port in {FIRST_SERVICE_PORT}-{LAST_SERVICE_PORT} (in use here: {sorted(_ports_in_use)})")


def wait_for(condition, timeout, step=0.05):
    """Polls condition() until it is true (returns True) or timeout seconds have passed (returns False)."""
    deadline = time.time() + timeout
    while not condition():
        if time.time() >= deadline:
            return False
        time.sleep(step)
    return True


# --------------------------------------------------------------------------- the stack

def stack_up(stack, settings=None):
    """Start PostgreSQL and PgBouncer in the folder `stack` (created; must not hold a running stack); `settings`
    (e.g. DB_SETTINGS): the database's session settings (ALTER DATABASE payments SET), else the server's defaults."""
    import psycopg
    os.makedirs(stack, exist_ok=True)
    os.chmod(stack, 0o755)
    for port in (PG_PORT, BOUNCER_PORT):
        if port_open(port):
            raise HarnessError(f"port {port} is already in use on 127.0.0.1 (a stack left running?)")
    pg = os.path.join(stack, "pg")
    script = 'source "$1/scripts/lib/cluster.sh" && start_cluster "$2" "$3" "$4" "max_connections = 400"'
    preload = "shared_preload_libraries = 'idempotency'"
    if EDITION == "managed":
        # No library of ours is loaded: nothing preloaded, and the databases get the plain script, written here
        # from this tree's managed/ (generate.py, what `make managed` runs).
        global _managed_script
        preload = "shared_preload_libraries = ''"
        out = os.path.join(stack, "managed")
        r = subprocess.run([sys.executable, os.path.join(REPO, "managed", "generate.py"), out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise HarnessError(f"managed/generate.py failed: {r.stdout}")
        _managed_script = os.path.join(out, "idempotency-managed.sql")
    for attempt in range(5):
        r = subprocess.run(["bash", "-c", script, "_", REPO, pg, str(PG_PORT), preload], cwd=stack,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # The port is inside the ephemeral range: another program's outgoing connection can hold it for a moment
        # (the server then fails to bind it). Wait and start afresh.
        if r.returncode == 0 or "Address already in use" not in _tail(os.path.join(pg, "server.log"), 4000):
            break
        log(f"port {PG_PORT} was held by another socket; starting the cluster again")
        subprocess.run(["bash", "-c", 'source "$1/scripts/lib/cluster.sh" && stop_cluster "$2"', "_", REPO, pg],
                       cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
    if r.returncode != 0:
        raise HarnessError(f"start_cluster failed: {r.stdout}\n{_tail(os.path.join(pg, 'server.log'), 2000)}")
    create_database(DB)
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{PG_PORT}/postgres", autocommit=True) as c:
        for name, value in (settings or {}).items():  # in force for every session opened from now on (PgBouncer's)
            c.execute(f"ALTER DATABASE {DB} SET {name} = '{value}'")

    bdir = os.path.join(stack, "pgbouncer")
    os.makedirs(bdir, exist_ok=True)
    with open(os.path.join(bdir, "userlist.txt"), "w") as f:
        f.write('"postgres" ""\n')
    ini = os.path.join(bdir, "pgbouncer.ini")
    with open(ini, "w") as f:
        f.write(f"""[databases]
{DB} = host=127.0.0.1 port={PG_PORT} dbname={DB} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {BOUNCER_PORT}
unix_socket_dir =
auth_type = trust
auth_file = {bdir}/userlist.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
reserve_pool_size = 5
ignore_startup_parameters = extra_float_digits,search_path,options
logfile = {bdir}/pgbouncer.log
pidfile = {bdir}/pgbouncer.pid
""")
    subprocess.run(["chown", "-R", "postgres", bdir], check=True)
    # pgbouncer refuses to run as root: run it as postgres, daemonized, with its pid file in bdir.
    subprocess.run(["runuser", "-u", "postgres", "--", "pgbouncer", "-d", "-q", ini], cwd=bdir, check=True)
    if not wait_for(lambda: port_open(BOUNCER_PORT), 10):
        raise HarnessError("pgbouncer did not start: " + _tail(os.path.join(bdir, "pgbouncer.log")))
    with psycopg.connect(BOUNCER_URL, autocommit=True, prepare_threshold=None) as c:
        c.execute("SELECT 1")
    for d in ("bin", "logs"):
        os.makedirs(os.path.join(stack, d), exist_ok=True)
    log(f"stack up in {stack}: postgres {DIRECT_URL}, pgbouncer {BOUNCER_URL}")


def create_database(name):
    """A database with CREATE EXTENSION idempotency (IDEM_E2E_EDITION=managed: the managed edition's plain
    script) and clients/schema.sql; returns its direct URL."""
    import psycopg
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{PG_PORT}/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:{PG_PORT}/{name}"
    schema = open(os.path.join(CLIENTS, "schema.sql")).read()
    if EDITION == "managed":
        script = _managed_script or os.path.join(REPO, "dist", "idempotency-managed.sql")
        r = subprocess.run([os.path.join(PG_BIN, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", script],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise HarnessError(f"the managed edition's script failed in {name}: {r.stdout[-3000:]}")
    with psycopg.connect(url, autocommit=True) as c:
        if EDITION != "managed":
            c.execute("CREATE EXTENSION idempotency")
        c.execute(schema)
    return url


def _kill_group(pid, sig):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stack_down(stack):
    """Stop every service recorded in the stack, PgBouncer and PostgreSQL, then remove the folder."""
    if not os.path.isdir(stack):
        return
    # SIGTERM, then SIGKILL after 5 s: each service's process group (started with start_new_session), and
    # PgBouncer (SIGTERM is its immediate shutdown)
    for pidfile, kill in [(f, os.killpg) for f in glob.glob(os.path.join(stack, "pids", "*"))] + [
            (os.path.join(stack, "pgbouncer", "pgbouncer.pid"), os.kill)]:
        try:
            pid = int(open(pidfile).read().strip())
            kill(pid, signal.SIGTERM)
            wait_for(lambda: not _alive(pid), 5)
            kill(pid, signal.SIGKILL)
        except (ValueError, OSError):  # no such file, or the process is gone
            pass
    pg = os.path.join(stack, "pg")
    if os.path.isdir(pg):
        subprocess.run(["bash", "-c", 'source "$1/scripts/lib/cluster.sh" && stop_cluster "$2"', "_", REPO, pg],
                       cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(stack, ignore_errors=True)


def _tail(path, n=3000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- services

def _fmt(args, stack):
    b = os.path.join(stack, "bin")
    return [a.replace("{bin}", b) for a in args]


def prepare_service(stack, lang):
    """Build or install what the service needs, once per stack. Raises HarnessError with the output on failure."""
    spec = SERVICES[lang]
    cwd = service_dir(lang)
    if not os.path.exists(os.path.join(cwd, spec["ready"])):
        raise HarnessError(f"{lang}: clients/{spec['dir']}/{spec['ready']} does not exist (the harness's start "
                           f"table in clients/e2e/harness.py expects it)")
    cmds = []
    if "prepare_if_missing" in spec:
        path, more = spec["prepare_if_missing"]
        if not os.path.exists(os.path.join(cwd, path)):
            cmds += more
    cmds += spec.get("prepare", [])
    # Named by what it runs, not by the service: services sharing a folder and commands share the work.
    marker = os.path.join(stack, "bin", hashlib.sha1(repr((spec["dir"], cmds)).encode()).hexdigest() + ".prepared")
    if os.path.exists(marker):
        return
    env = dict(os.environ, **spec.get("prepare_env", {}))
    for cmd in cmds:
        cmd = _fmt(cmd, stack)
        r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise HarnessError(f"{lang}: `{' '.join(cmd)}` failed ({r.returncode}):\n{r.stdout[-3000:]}")
    open(marker, "w").close()


def database_url(mode):
    return DIRECT_URL if mode == "direct" else BOUNCER_URL


class Service:
    def __init__(self, stack, lang, mode, port=None, extra_env=None):
        self.stack, self.lang, self.mode, self.name = stack, lang, mode, f"{lang}-{mode}"
        self.port = port or SERVICE_PORTS[(lang, mode)]
        self.base = f"http://127.0.0.1:{self.port}"
        self.logfile = os.path.join(stack, "logs", f"{self.name}.log")
        self.pidfile = os.path.join(stack, "pids", f"{self.name}.pid")  # for stack_down
        self.proc = None
        self.extra_env = extra_env or {}

    def start(self, timeout=30.0):
        prepare_service(self.stack, self.lang)
        for attempt in range(3):
            self.port = pick_port(self.port)
            self.base = f"http://127.0.0.1:{self.port}"
            try:
                return self._start(timeout)
            except HarnessError as e:
                if attempt == 2 or "address already in use" not in str(e).lower():
                    raise
                log(f"{self.name}: port {self.port} was taken meanwhile, trying another")

    def _start(self, timeout):
        spec = SERVICES[self.lang]
        env = {**os.environ, **spec.get("env", {}), "PORT": str(self.port), "DATABASE_URL": database_url(self.mode),
               "PAYMENTS_FAULTS": "1", "RIDES_LEASE_SECONDS": str(RIDES_LEASE_SECONDS), **self.extra_env}
        argv = _fmt(spec["argv"], self.stack)
        with open(self.logfile, "ab") as logf:
            self.proc = subprocess.Popen(argv, cwd=service_dir(self.lang), env=env, stdin=subprocess.DEVNULL,
                                         stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        os.makedirs(os.path.dirname(self.pidfile), exist_ok=True)
        with open(self.pidfile, "w") as f:
            f.write(str(self.proc.pid))
        _ports_in_use.add(self.port)
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                _ports_in_use.discard(self.port)
                raise HarnessError(f"{self.name}: `{' '.join(argv)}` exited with {self.proc.returncode}:\n"
                                   + _tail(self.logfile))
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=2) as r:
                    body = r.read()
                    if r.status == 200 and json.loads(body) == {"ok": True}:
                        return self
                    last = f"{r.status} {body!r}"
            except Exception as e:  # noqa: BLE001 - not up yet
                last = repr(e)
            time.sleep(0.1)
        self.stop()
        raise HarnessError(f"{self.name}: GET /healthz did not answer 200 {{\"ok\":true}} in {timeout}s "
                           f"(last: {last}):\n" + _tail(self.logfile))

    def stop(self, grace=5.0):
        if self.proc is None:
            return
        # Waited for with wait(), not stack_down's polling: the service is this process's child, and until it
        # is reaped its pid answers signal 0, so the poll took the whole grace for every service (90 s at the end
        # of an e2e session). SIGKILL then: the group's other processes, and a leader that did not stop.
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
            _kill_group(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)
        _ports_in_use.discard(self.port)
        with contextlib.suppress(OSError):
            os.unlink(self.pidfile)
        self.proc = None


# --------------------------------------------------------------------------- command line

def main(argv):
    if len(argv) != 2 or argv[0] not in ("stack-up", "createdb", "stack-down"):
        print(__doc__, file=sys.stderr)
        return 2
    command, arg = argv
    if command == "createdb":
        print(create_database(arg))
    elif command == "stack-down":
        stack_down(arg)
    else:
        try:
            stack_up(arg, DB_SETTINGS)
        except Exception as e:  # noqa: BLE001 - reported, and what did start is stopped
            stack_down(arg)
            print(f"stack-up failed: {e}", file=sys.stderr)
            return 1
        print(f"E2E_STACK_DIR={arg}\nE2E_DIRECT_URL={DIRECT_URL}\nE2E_PGBOUNCER_URL={BOUNCER_URL}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
