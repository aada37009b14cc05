#!/usr/bin/env bash
# Installs the Node.js client's dependencies (npm ci) and runs its tests (node --test).
# Node.js and npm come from scripts/install-deps.sh clients (Debian's, installed when run as root, unless a node
# is on the PATH already). Integration tests run against a real database when IDEM_TEST_DATABASE_URL is exported
# (a libpq URI of a database where the idempotency extension can be created, e.g.
# postgresql://postgres@127.0.0.1:55460/payments); otherwise they are skipped.
# Ends with "clients/node: N passed, N failed" (node --test's own count, from its TAP reporter's closing summary;
# cancelled tests count as failed) and exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
"$root/scripts/install-deps.sh" clients
echo "test.sh: node $(node --version), npm $(npm --version)"

# npm ci empties node_modules and installs the lock file's versions again (7 s and more); skipped when
# node_modules already holds exactly them: npm records what it installed in node_modules/.package-lock.json,
# the lock file's packages without the root entry.
installed_as_locked() {
    [ -f package-lock.json ] && [ -f node_modules/.package-lock.json ] && node -e '
        const locked = require("./package-lock.json").packages;
        const installed = require("./node_modules/.package-lock.json").packages;
        delete locked[""];
        process.exit(JSON.stringify(locked) === JSON.stringify(installed) ? 0 : 1);'
}
if installed_as_locked; then
    echo "test.sh: node_modules matches package-lock.json, npm ci skipped"
elif [ -f package-lock.json ]; then
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
tap=$(mktemp)
trap 'rm -f "$tap"' EXIT
status=0
node --test --test-reporter=spec --test-reporter-destination=stdout --test-reporter=tap \
    --test-reporter-destination="$tap" test/ || status=$?
read -r passed failed _ < <(/usr/bin/python3 "$root/scripts/lib/counts.py" node-tap "$tap")
echo "clients/node: $passed passed, $failed failed"
exit "$status"
