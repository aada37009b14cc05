#!/bin/sh
# Tests of the Python client: installs Debian's packages if missing, then runs pytest with Debian's Python.
# The database tests run when IDEM_TEST_DATABASE_URL is exported (a libpq URI of a database where the
# extension can be created, e.g. postgresql://postgres@127.0.0.1:55470/pytest); otherwise they are skipped.
set -eu
cd "$(dirname "$0")"

PY=/usr/bin/python3
# The library needs psycopg (+ pool); its adapters and the sample services: Starlette/FastAPI + uvicorn + httpx
# (tests), SQLAlchemy and Django on psycopg2.
PACKAGES="python3-psycopg python3-psycopg-pool python3-pytest python3-waitress python3-starlette python3-fastapi
    python3-uvicorn python3-httpx python3-anyio python3-sqlalchemy python3-psycopg2 python3-django python3-build"

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    $SUDO apt-get install -y --no-install-recommends $missing ||
        { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends $missing; }
fi

if [ -n "${IDEM_TEST_DATABASE_URL:-}" ]; then
    echo "test.sh: database tests against $IDEM_TEST_DATABASE_URL"
else
    echo "test.sh: IDEM_TEST_DATABASE_URL is not set, the database tests are skipped"
fi

set +e
PYTHONDONTWRITEBYTECODE=1 "$PY" -m pytest -v -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "test.sh: no tests ran" >&2
    exit 1
fi
exit "$rc"
