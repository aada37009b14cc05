"""pytest fixtures: one stack per session (or the one clients/run-tests.sh started, named by E2E_STACK_DIR),
one service per (language, mode), started on first use and stopped at the end of the session.

A language whose folder does not exist is skipped, unless E2E_REQUIRE_ALL=1 (clients/run-tests.sh sets it),
where it fails. A language whose folder exists but whose service does not start fails every one of its tests.
E2E_LANGS=go,python limits the run to some languages.
"""

import fcntl
import os
import sys
import tempfile

import psycopg
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


# Checks that come after every other check of every service, in this order: the idle spell (test_e2e.py; one
# wait then serves all services, where a wait per service cost 12 s each, 18 times) and the last word on the
# ledger. Pytest has grouped the tests by service by then (its order for session-scoped parameters); this moves
# the tests of these names, keeping their order, behind all others.
RUN_LAST = ("test_409_at_once_after_an_idle_spell", "test_zz_ledger_has_one_debit_per_key")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    last = [item for name in RUN_LAST for item in items if getattr(item, "originalname", None) == name]
    moved = set(map(id, last))
    items[:] = [item for item in items if id(item) not in moved] + last


@pytest.fixture(autouse=True)
def _rule_applies(request):
    """A check of a rule that cannot apply to its service (harness.NOT_APPLICABLE) is skipped with the reason; a
    check marked with two rules (the lifetime header on POST /rides: key-lifetime and lease-rides) needs both."""
    marks = list(request.node.iter_markers("rule"))
    if marks and "service" in request.fixturenames:
        lang = request.getfixturevalue("service").lang
        for mark in marks:
            reason = harness.NOT_APPLICABLE.get((lang, mark.args[0]))
            if reason:
                pytest.skip(f"CONTRACT.md rule '{mark.args[0]}' does not apply to {lang}: {reason}")


def selected_langs():
    env = os.environ.get("E2E_LANGS")
    return [l for l in env.split(",") if l] if env else list(harness.LANGS)


@pytest.fixture(scope="session")
def stack():
    given = os.environ.get("E2E_STACK_DIR")
    if given:
        yield given
        return
    lock = open(harness.LOCK, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one stack on its ports at a time
    d = tempfile.mkdtemp(prefix="idem-e2e.")
    try:
        harness.stack_up(d, harness.DB_SETTINGS)
        yield d
    finally:
        harness.stack_down(d)
        lock.close()


@pytest.fixture(scope="session")
def db(stack):
    """Autocommit connection straight to PostgreSQL, to inspect the ledger and the stored keys."""
    with psycopg.connect(harness.DIRECT_URL, autocommit=True) as c:
        yield c


_services = {}
_failures = {}


@pytest.fixture(scope="session")
def _service_registry(stack):
    yield _services
    for svc in list(_services.values()):
        svc.stop()
    _services.clear()


def get_service(registry, stack, lang, mode):
    key = (lang, mode)
    if key not in registry and key not in _failures:
        if not harness.service_present(lang):
            msg = f"clients/{harness.SERVICES[lang]['dir']} does not exist"
            if os.environ.get("E2E_REQUIRE_ALL") != "1":
                pytest.skip(msg)
            _failures[key] = msg
        else:
            try:
                registry[key] = harness.Service(stack, lang, mode).start()
            except harness.HarnessError as e:
                _failures[key] = f"{lang}/{mode} service did not start: {e}"
    if key in _failures:
        pytest.fail(_failures[key], pytrace=False)
    return registry[key]
