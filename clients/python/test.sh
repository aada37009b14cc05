#!/bin/sh
# Tests of the Python client: pytest with Debian's Python and Debian's packages (scripts/install-deps.sh clients,
# installed when run as root: psycopg (+ pool), and for the adapters and the sample services Starlette/FastAPI +
# uvicorn + httpx, SQLAlchemy and Django on psycopg2, waitress).
# The database tests run when IDEM_TEST_DATABASE_URL is exported (a libpq URI of a database where the
# extension can be created, e.g. postgresql://postgres@127.0.0.1:55470/pytest); otherwise they are skipped.
# Ends with "clients/python: N passed, N failed" (pytest's own count, from its JUnit XML; errors count as failed)
# and exits non-zero on any failure.
set -eu
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
"$root/scripts/install-deps.sh" clients

PY=/usr/bin/python3
if [ -n "${IDEM_TEST_DATABASE_URL:-}" ]; then
    echo "test.sh: database tests against $IDEM_TEST_DATABASE_URL"
else
    echo "test.sh: IDEM_TEST_DATABASE_URL is not set, the database tests are skipped"
fi

junit=$(mktemp)
trap 'rm -f "$junit"' EXIT
set +e
PYTHONDONTWRITEBYTECODE=1 "$PY" -m pytest -v -p no:cacheprovider --junitxml="$junit" "$@"
rc=$?
set -e
counts=$("$PY" "$root/scripts/lib/counts.py" junit "$junit" 2>/dev/null) || counts="0 1 0"
# shellcheck disable=SC2086  # three numbers, split on purpose
set -- $counts
echo "clients/python: $1 passed, $2 failed"
if [ "$rc" -eq 5 ]; then
    echo "test.sh: no tests ran" >&2
    exit 1
fi
exit "$rc"
