#!/usr/bin/env bash
# Install the Node.js client's dependencies and run its tests (node --test).
# Integration tests run against a real database when IDEM_TEST_DATABASE_URL is exported (a libpq URI of a database
# where the idempotency extension can be created, e.g. postgresql://postgres@127.0.0.1:55460/payments); otherwise
# they are skipped. Exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test.sh: node or npm missing, installing the Debian packages nodejs and npm" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    else
        echo "test.sh: Node.js (>= 18, tested with 20) and npm are required" >&2
        exit 1
    fi
fi
echo "test.sh: node $(node --version), npm $(npm --version)"

if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund
else
    npm install --no-audit --no-fund
fi

if [ -n "${IDEM_TEST_DATABASE_URL:-}" ]; then
    echo "test.sh: integration tests against IDEM_TEST_DATABASE_URL"
    export IDEM_TEST_DATABASE_URL
else
    echo "test.sh: IDEM_TEST_DATABASE_URL is not set, the integration tests are skipped"
fi
exec node --test test/
