#!/usr/bin/env bash
# Benchmark of the client services (not part of the tests): requests/s of POST /payments with the idempotency
# middleware (a fresh key per request) against POST /payments-unprotected, each straight to PostgreSQL and through
# PgBouncer (transaction pooling), in alternating rounds; medians and ratios are written to bench/clients/RESULTS.md.
# As root on Debian 12 with the extension installed. Knobs: BENCH_ROUNDS (3), BENCH_SECONDS (5),
# BENCH_CONNECTIONS (16), BENCH_THREADS (2), BENCH_LANGS (go,node,python), BENCH_OUT (RESULTS.md beside this file).
# Takes about (4 configurations x rounds x seconds + 30 s) per service. Stops everything it started.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in pgbouncer python3-psycopg wrk; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
exec /usr/bin/python3 "$here/bench.py"
