#!/usr/bin/env bash
# Benchmark of the client services (not part of the tests): requests/s of POST /payments with the idempotency
# middleware (a fresh key per request) against POST /payments-unprotected, each straight to PostgreSQL and through
# PgBouncer (transaction pooling), in alternating rounds; medians and ratios are written to bench/clients/RESULTS.md.
# As root on Debian 12 with the extension installed. Knobs: BENCH_ROUNDS (3), BENCH_SECONDS (5),
# BENCH_CONNECTIONS (16), BENCH_THREADS (2), BENCH_LANGS (go,node,python), BENCH_OUT (RESULTS.md beside this file).
# Takes about (4 configurations x rounds x seconds + 30 s) per service. Stops everything it started.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/../../scripts/install-deps.sh" clients
exec /usr/bin/python3 "$here/bench.py"
