"""Settings that another role can choose for a session (``ALTER DATABASE ... SET``, ``ALTER ROLE ... SET``, PGOPTIONS)
change nothing the client reads back: every adapter and every lease mode, on connections opened with
``bytea_output = 'escape'``, ``DateStyle = 'SQL, DMY'``, ``IntervalStyle = 'sql_standard'``, ``TimeZone =
'Asia/Kolkata'`` and ``extra_float_digits = 0``, replays binary, non-UTF-8 and JSON answers byte for byte and
stores the expiry its ttl says.  psycopg 3 reads the claim and the lease in binary; psycopg2 (SQLAlchemy, Django)
reads the claim's text form, whose bytea it decodes in either form ``bytea_output`` gives."""

import datetime
from urllib.parse import quote

import pytest

from idempotency_pg.core import claim_fields
from idempotency_pg.lease import Step

from conftest import needs_db
from test_adapters import ANSWERS, Asgi, Django, Req, Wsgi
from test_integration import ledger

SETTINGS = {"bytea_output": "escape", "DateStyle": "SQL, DMY", "IntervalStyle": "sql_standard",
            "TimeZone": "Asia/Kolkata", "extra_float_digits": "0"}
#: libpq's ``options``: each setting as ``-c name=value``, a space in a value escaped with a backslash.
OPTIONS = " ".join("-c %s=%s" % (k, v.replace(" ", "\\ ")) for k, v in SETTINGS.items())
TTL = datetime.timedelta(days=1, hours=2, minutes=3)

ADAPTERS = ["wsgi", "wsgi-separate", "wsgi-unprepared", "asgi-psycopg", "asgi-sqlalchemy", "django"]


# --------------------------------------------------------------------------- the text forms, without a database

def test_bytea_in_either_text_form():
    from idempotency_pg.core import bytea_from_text

    every = bytes(range(256))
    assert bytea_from_text("\\x" + every.hex()) == every
    escape = "".join("\\\\" if b == 0x5C else chr(b) if 0x20 <= b < 0x7F else "\\%03o" % b for b in every)
    assert bytea_from_text(escape) == every
    assert bytea_from_text("\\\\x41") == b"\\x41"  # an escaped backslash then x: not the hex form
    assert bytea_from_text("") == b""


def test_the_claim_in_text_and_in_binary():
    body = b'\x00\\"q" \xff'
    # the record literal: the body quoted, its backslashes and quotes doubled (escape form: \000 \\ " \377)
    text = '(replay,201,text/plain,"{""A"": ""1""}","\\\\000\\\\\\\\""q"" \\\\377")'
    assert claim_fields(text) == ("replay", 201, "text/plain", '{"A": "1"}', body)
    fields = [(25, b"replay"), (23, (201).to_bytes(4, "big")), (25, None), (3802, b'\x01{"A": "1"}'), (17, body)]
    binary = (5).to_bytes(4, "big") + b"".join(
        oid.to_bytes(4, "big") + (len(v).to_bytes(4, "big", signed=True) + v if v is not None else b"\xff" * 4)
        for oid, v in fields)
    assert claim_fields(binary) == ("replay", 201, None, '{"A": "1"}', body)
    # a value with a field past the five (a later version's) is read as its five, in either form
    assert claim_fields(text[:-1] + ',"Tue, 08 Dec 2026 10:30:00 GMT")') == claim_fields(text)
    sixth = b"".join(oid.to_bytes(4, "big") + len(v).to_bytes(4, "big") + v for oid, v in [(25, b"x y")])
    assert claim_fields((6).to_bytes(4, "big") + binary[4:] + sixth) == claim_fields(binary)


# --------------------------------------------------------------------------- against the database

def with_options(url):
    return url + ("&" if "?" in url else "?") + "options=" + quote(OPTIONS, safe="")


@pytest.fixture(scope="module")
def settings_url(database_url):
    import psycopg

    url = with_options(database_url)
    with psycopg.connect(url) as conn:  # the settings are in force on such a connection
        assert {k: conn.execute("SELECT current_setting(%s)", (k,)).fetchone()[0] for k in SETTINGS} == SETTINGS
    return url


@pytest.fixture(scope="module")
def settings_pool(settings_url):
    from idempotency_pg import connection_pool

    p = connection_pool(settings_url, min_size=1, max_size=4, timeout=10)
    p.wait(timeout=30)
    yield p
    p.close()


@pytest.fixture(scope="module")
def django_alias(django_configured, database_url):
    """A Django database alias whose connections have the settings."""
    from django.db import connections

    from payments_service.django_app import database_settings

    connections.databases["settings"] = dict(database_settings(database_url), OPTIONS={"options": OPTIONS})
    yield "settings"
    connections["settings"].close()


class DjangoOn(Django):
    """:class:`test_adapters.Django` on another database alias: the claim and the handler's write on its connection."""

    def __init__(self, using, **options):
        from idempotency_pg.django import idempotent

        super().__init__()
        self.using = using
        self.view = idempotent(scope=lambda request: request.META["HTTP_X_ACCOUNT"], using=using, **options)(self.app)

    def write(self, ctx):
        from payments_service.djangoledger.models import Ledger

        Ledger.objects.using(self.using).create(account=ctx.scope, amount_cents=-1, currency="EUR",
                                                idempotency_key=ctx.key)


@pytest.fixture(params=ADAPTERS)
def adapter(request, settings_url):
    name = request.param
    if name.startswith("wsgi"):
        modes = {"wsgi": {}, "wsgi-separate": {"combine": False}, "wsgi-unprepared": {"prepare": False}}
        return Wsgi(request.getfixturevalue("settings_pool"), ttl=TTL, **modes[name])
    if name.startswith("asgi"):
        a = Asgi(name[5:], settings_url)
        send = a.send
        a.send = lambda reqs: send(reqs, ttl=TTL)
        return a
    return DjangoOn(request.getfixturevalue("django_alias"), ttl=TTL)


@needs_db
@pytest.mark.parametrize("then", ["created", "text", "binary", "latin-1"])
def test_a_replay_is_the_answer_byte_for_byte_whatever_the_session_settings(adapter, db, account, then):
    first, again = adapter.send([Req(account, then), Req(account, then)])
    want = ANSWERS[then]
    assert (first.status, first.body, first.header("Idempotent-Replayed")) == (want.status, want.body, None), first
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (want.status, want.body, "true"), again
    assert again.header("Content-Type") == want.header("Content-Type")
    assert len(ledger(db, account)) == 1
    # the ttl went in as an interval under IntervalStyle sql_standard: the expiry is the claim's time plus it
    assert db.execute("SELECT expires_at - created_at FROM idempotency_keys WHERE scope = %s AND key = 'k'",
                      (account,)).fetchone() == (TTL,)


# --------------------------------------------------------------------------- lease mode

@pytest.fixture(params=["sync", "async", "django"])
def lease_mode(request, settings_url):
    import test_lease

    if request.param == "sync":
        return test_lease.Sync(settings_url, request.getfixturevalue("settings_pool"))
    if request.param == "async":
        return test_lease.Async(settings_url, None)
    from idempotency_pg.django import lease_pool

    mode = test_lease.Sync(settings_url, None)
    mode.pool = lease_pool(request.getfixturevalue("django_alias"))
    return mode


@needs_db
@pytest.mark.parametrize("then", ["created", "binary", "latin-1"])
def test_a_lease_runs_its_steps_and_replays_byte_for_byte_whatever_the_session_settings(lease_mode, db, account, then):
    from test_lease import go

    want = ANSWERS[then]
    seen = []

    async def step(ctx):
        seen.append((ctx.recovery_point, ctx.fencing_number))
        return {"n": 1.5}

    async def fin(conn, ctx):
        seen.append(ctx.state)
        return want

    async def body(pool):
        steps = [Step("one", action=lease_mode.fn(step))]
        first = await go(lease_mode, pool, account, "k", steps, fin=lease_mode.fn(fin))
        return first, await go(lease_mode, pool, account, "k", steps, fin=lease_mode.fn(fin))

    first, again = lease_mode.main(body)
    assert (first.status, first.body) == (want.status, want.body), first
    assert (again.status, again.body, again.header("Idempotent-Replayed")) == (want.status, want.body, "true"), again
    assert again.header("Content-Type") == want.header("Content-Type")
    assert seen[0][0] is None and isinstance(seen[0][1], int) and seen[1:] == [{"n": 1.5}]
