import os
import pathlib
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


@pytest.fixture
def account():
    """A fresh account (scope) per test, so tests never share keys."""
    return "t_" + uuid.uuid4().hex[:20]
