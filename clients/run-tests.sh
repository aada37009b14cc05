#!/usr/bin/env bash
# The client libraries' tests, as root on Debian 12 (CI), with the extension already built and installed:
#   1. installs the Debian packages of every client and of the harness (scripts/install-deps.sh clients java ruby);
#   2. starts a throwaway PostgreSQL 15 cluster (127.0.0.1:55480, scripts/lib/cluster.sh) and PgBouncer in
#      transaction pooling mode (127.0.0.1:55481) with clients/e2e/harness.py;
#   3. runs each language's own clients/<lang>/test.sh, with IDEM_TEST_DATABASE_URL naming a database of its own
#      in that cluster (CREATE EXTENSION idempotency and clients/schema.sql loaded);
#   4. runs the end-to-end suite (clients/e2e, every service direct and through PgBouncer) and the load suite.
# Ends with one line per suite, "<suite> N passed, N failed", and exits non-zero on any failure. Each count is
# the suite's own: the line "clients/<lang>: N passed, N failed" its test.sh ends with (go test -json, node
# --test's TAP summary, pytest's JUnit XML, Maven Surefire's XML reports), pytest's JUnit XML for e2e and load. A suite that exits non-zero
# fails whatever its count says.
# Stops every process it started on exit. E2E_LOAD_SECONDS sets the load test's length per service (default 6).
set -uo pipefail
clients=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$clients")
py=/usr/bin/python3

"$root/scripts/install-deps.sh" clients java ruby || { echo "clients-setup 0 passed, 1 failed"; exit 1; }

summary=()
any_failed=0
count() {  # count SUITE PASSED FAILED
    summary+=("$1 $2 passed, $3 failed")
    [ "$3" -ne 0 ] && any_failed=1
}

logs=$(mktemp -d /tmp/idem-clients-logs.XXXXXX)
stack=$(mktemp -d /tmp/idem-clients-stack.XXXXXX)
cleanup() {
    "$py" "$clients/e2e/harness.py" stack-down "$stack" 2>/dev/null
    rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One stack on ports 55480-55529 (IDEM_E2E_PORT_BASE moves them) at a time (pytest's own stack takes the same lock).
exec 9>"/tmp/idempotency-clients-e2e-${IDEM_E2E_PORT_BASE:-55480}.lock"
flock 9

if ! env_lines=$("$py" "$clients/e2e/harness.py" stack-up "$stack"); then
    echo "clients-setup 0 passed, 1 failed"
    exit 1
fi
eval "export $(echo "$env_lines" | tr '\n' ' ')"

# --- each language's own tests
# judge SUITE EXIT_STATUS PASSED FAILED: a non-zero exit is a failure even when no counted test failed; a suite
# that counted nothing at all tested nothing, which is a failure too.
judge() {
    local suite=$1 status=$2 ok=${3:-0} bad=${4:-0}
    if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
    if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then bad=1; echo "$suite ran no test"; fi
    count "$suite" "$ok" "$bad"
}

for lang in go node python java ruby; do
    suite=client-$lang
    dir=$clients/$lang
    log=$logs/$suite.log
    echo "== $suite: clients/$lang/test.sh"
    if [ ! -f "$dir/test.sh" ]; then
        echo "clients/$lang/test.sh is missing"
        count "$suite" 0 1
        continue
    fi
    url=$("$py" "$clients/e2e/harness.py" createdb "idem_test_$lang") || { count "$suite" 0 1; continue; }
    (cd "$dir" && IDEM_TEST_DATABASE_URL=$url bash ./test.sh) </dev/null 9>&- 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    ok=0 bad=0
    # its own closing line, "clients/<lang>: N passed, N failed" (the last, should a test print one too)
    read -r _ ok _ bad _ < <(grep -E "^clients/$lang: [0-9]+ passed, [0-9]+ failed\$" "$log" | tail -1)
    judge "$suite" "$status" "$ok" "$bad"
done

# --- the end-to-end and load suites, against the stack started above
run_pytest_suite() {  # run_pytest_suite SUITE PYTEST-ARGS...
    local suite=$1 log=$logs/$1.log junit=$logs/$1.xml status ok=0 bad=0 skipped=0
    shift
    echo "== $suite: pytest $*"
    # --durations: the slowest checks, where the suite's time goes
    (cd "$clients/e2e" && E2E_REQUIRE_ALL=1 "$py" -m pytest -v -rfEs --tb=short --durations=12 --junitxml="$junit" "$@") \
        </dev/null 9>&- 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    [ -f "$junit" ] && read -r ok bad skipped < <("$py" "$root/scripts/lib/counts.py" junit "$junit")
    judge "$suite" "$status" "$ok" "$bad"
    # Skipped checks (a rule harness.NOT_APPLICABLE says cannot apply to a service) are neither passed nor failed.
    [ "${skipped:-0}" -gt 0 ] && skips+=("$suite: $skipped checks skipped (reasons in its log above, 'SKIPPED')")
}
skips=()
run_pytest_suite e2e -m "not load" test_e2e.py
run_pytest_suite load -m load test_load.py

echo
for line in "${skips[@]}"; do echo "$line"; done
for line in "${summary[@]}"; do echo "$line"; done
exit $any_failed
