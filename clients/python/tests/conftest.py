import os
import pathlib
import socket
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # wsgi_client

DATABASE_URL = os.environ.get("IDEM_TEST_DATABASE_URL")
SCHEMA_SQL = pathlib.Path(__file__).resolve().parents[2] / "schema.sql"

needs_db = pytest.mark.skipif(not DATABASE_URL, reason="IDEM_TEST_DATABASE_URL is not set")


@pytest.fixture(scope="session")
def database_url():
    if not DATABASE_URL:
        pytest.skip("IDEM_TEST_DATABASE_URL is not set")
    import psycopg

    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        if conn.execute("SELECT to_regclass('ledger')").fetchone()[0] is None:
            conn.execute(SCHEMA_SQL.read_text())
    return DATABASE_URL


@pytest.fixture(scope="session")
def pool(database_url):
    from idempotency_pg import connection_pool

    p = connection_pool(database_url, min_size=2, max_size=10, timeout=10)
    p.wait(timeout=30)
    yield p
    p.close()


@pytest.fixture
def db(database_url):
    """An autocommit connection for checking what was written."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn:
        yield conn


@pytest.fixture(scope="session")
def django_configured(database_url):
    """Django's settings for the tests' database (the sample service's); its connections closed at the end."""
    from payments_service.django_app import configure

    configure(database_url, faults=True)
    yield
    from django.db import connections
    connections.close_all()


@pytest.fixture
def account():
    """A fresh account (scope) per test, so tests never share keys."""
    return "t_" + uuid.uuid4().hex[:20]


@pytest.fixture(scope="module")
def start_service(database_url):
    """``start_service(argv) -> port``: a sample service (``python -m ...``) on a free loopback port, with faults on,
    ready (its /healthz answered 200); stopped at the end of the module."""
    import json
    import subprocess
    import tempfile
    import time
    import urllib.error
    import urllib.request

    started = []

    def start(argv):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        src = str(pathlib.Path(__file__).resolve().parents[1] / "src")
        env = dict(os.environ, PORT=str(port), DATABASE_URL=database_url, PAYMENTS_FAULTS="1", POOL_SIZE="8",
                   THREADS="8", PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable] + argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        started.append((proc, log))
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=1) as r:
                    assert json.load(r) == {"ok": True}
                    return port
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError("%s did not start:\n%s" % (argv, log.read().decode()))
                time.sleep(0.05)

    yield start
    for proc, log in started:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def traced_round_trips(path):
    """Each round trip of a libpq trace, named by what it sends: a simple query (Query) or an extended-protocol
    exchange up to its Sync (a pipeline of several statements, or one), e.g. "BEGIN; idem_lease_extend" or
    "idem_checkpoint; COMMIT": each statement by the idem_ function it calls, else its text; a prepared statement
    bound again (Bind without Parse) by the text it was parsed with."""
    import re

    def name(sql):
        called = [f for f in re.findall(r"\b(idem_\w+)\(", sql) if f != "idem_hash"]
        return called[0] if called else sql.strip()

    trips, pending, prepared = [], [], {}
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")  # F(rontend)/B(ackend), length, message, its fields
            if fields[0] != "F" or len(fields) < 3:
                continue
            if fields[2] == "Query":
                trips.append(re.match(r'\s*"(.*)"$', fields[3]).group(1))
            elif fields[2] == "Parse":
                stmt, sql = re.match(r'\s*"([^"]*)" "(.*)" \d+', fields[3]).groups()
                prepared[stmt] = name(sql)
            elif fields[2] == "Bind":
                pending.append(prepared[re.match(r'\s*"[^"]*" "([^"]*)"', fields[3]).group(1)])
            elif fields[2] == "Sync":
                trips.append("; ".join(pending))
                pending = []
    return trips
