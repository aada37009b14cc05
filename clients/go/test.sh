#!/usr/bin/env bash
# Go client: builds offline with Debian's Go and Go libraries, runs `go test ./...`, and, when
# IDEM_TEST_DATABASE_URL is set, also starts the payments binary against that database for a smoke test.
# Ends with "clients/go: N passed, N failed" (go test's own count from -json, one per test and subtest, plus the
# smoke test) and exits non-zero on any failure. The Debian packages come from scripts/install-deps.sh clients
# (installed when run as root); works without network once they are (GOPROXY=off, -mod=vendor over
# /usr/share/gocode).
#
#   IDEM_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:55450/payments clients/go/test.sh
#
# The database needs CREATE EXTENSION idempotency and clients/schema.sql. Without the variable the database tests
# are skipped (reported as SKIP) and only the unit tests run.
set -eu
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
"$root/scripts/install-deps.sh" clients

export GOPROXY=off GOFLAGS=-mod=vendor GOTOOLCHAIN=local GO111MODULE=on
export GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/go-build}"
export PATH="/usr/lib/go/bin:$PATH"

./debian-vendor.sh
go version
unformatted=$(find . -path ./vendor -prune -o -name '*.go' -print | xargs gofmt -l)
[ -z "$unformatted" ] || { echo "test.sh: not gofmt-formatted: $unformatted" >&2; exit 1; }
go vet ./...
mkdir -p bin
go build -o bin/payments ./cmd/payments

status=0
counts=$(mktemp)
trap 'rm -f "$counts"' EXIT
set -o pipefail # only here: the smoke test's `curl | grep -q` may end curl with SIGPIPE
go test -count=1 -json ./... | /usr/bin/python3 -u "$root/scripts/lib/counts.py" go-json "$counts" || status=1
set +o pipefail
read -r passed failed _ <"$counts" || { passed=0 failed=1; }

if [ -n "${IDEM_TEST_DATABASE_URL:-}" ]; then
    echo "=== smoke test of bin/payments"
    port=${SMOKE_PORT:-55459}
    base=http://127.0.0.1:$port
    log=$(mktemp)
    pid=
    trap '[ -z "$pid" ] || kill $pid 2>/dev/null || true; rm -f "$log" "$counts"' EXIT
    start() {  # the service with faults on; waits for /healthz
        PORT=$port DATABASE_URL=$IDEM_TEST_DATABASE_URL PAYMENTS_FAULTS=1 bin/payments >>"$log" 2>&1 &
        pid=$!
        i=0
        until curl -fsS "$base/healthz" >/dev/null 2>&1; do
            i=$((i + 1))
            [ $i -lt 100 ] || { echo "healthz never answered"; cat "$log"; return 1; }
            kill -0 $pid 2>/dev/null || { echo "bin/payments exited"; cat "$log"; return 1; }
            sleep 0.1
        done
    }
    post() {  # post PATH KEY [curl args]: prints the status line and headers
        path=$1 k=$2
        shift 2
        curl -sS -o /dev/null -D - -X POST "$base$path" -H "Authorization: Bearer $acct" \
            -H "Idempotency-Key: $k" -H 'Content-Type: application/json' "$@" \
            -d '{"amount_cents": 10000, "currency": "USD"}'
    }
    smoke() {
        start || return 1
        key="smoke-$(date +%s%N)"
        acct="smoke_$(date +%s%N)"
        post /payments "$key" -H 'X-Fault: 503' | head -1 | grep -q ' 503' || { echo "fault 503 not answered 503"; return 1; }
        post /payments "$key" | head -1 | grep -q ' 201' || { echo "first POST not 201"; return 1; }
        post /payments "$key" | grep -qi '^idempotent-replayed: true' || { echo "retry not replayed"; return 1; }
        echo "smoke test: 503 not cached, 201, replay: ok"
    }
    if smoke; then passed=$((passed + 1)); else failed=$((failed + 1)) status=1; fi
    kill $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
fi

echo "clients/go: $passed passed, $failed failed"
exit $status
