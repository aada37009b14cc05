#!/bin/sh
# Tests of the Ruby client: minitest with Debian's Ruby and gems (scripts/install-deps.sh ruby, installed when run
# as root: ruby, ruby-pg, ruby-rack, ruby-sinatra, ruby-minitest, unicorn; rubygems.org is never asked).
# The database tests run when IDEM_TEST_DATABASE_URL is exported (a libpq URI of a database with CREATE EXTENSION
# idempotency and clients/schema.sql, e.g. what `clients/e2e/harness.py createdb NAME` prints); otherwise they are
# skipped. Ends with "clients/ruby: N passed, N failed" (minitest's own counts: runs less failures, errors and
# skips; errors count as failed) and exits non-zero on any failure.
set -eu
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
"$root/scripts/install-deps.sh" ruby

if [ -n "${IDEM_TEST_DATABASE_URL:-}" ]; then
    echo "test.sh: database tests against $IDEM_TEST_DATABASE_URL"
else
    echo "test.sh: IDEM_TEST_DATABASE_URL is not set, the database tests are skipped"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
ruby -w -Ilib -Itest -e 'Dir["test/test_*.rb"].sort.each { |f| require File.expand_path(f) }' -- -v "$@" 2>&1 | tee "$log"
rc=$?
set -e
line=$(grep -E '^[0-9]+ runs, [0-9]+ assertions, [0-9]+ failures, [0-9]+ errors, [0-9]+ skips' "$log" | tail -1)
if [ -z "$line" ]; then
    echo "clients/ruby: 0 passed, 1 failed"
    exit 1
fi
# shellcheck disable=SC2086  # the counts, split on purpose
set -- $(echo "$line" | tr -dc '0-9 ')
runs=$1 failures=$3 errors=$4 skips=$5
echo "clients/ruby: $((runs - failures - errors - skips)) passed, $((failures + errors)) failed"
[ "$runs" -gt 0 ] || { echo "test.sh: no tests ran" >&2; exit 1; }
exit "$rc"
