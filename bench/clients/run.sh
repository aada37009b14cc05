#!/usr/bin/env bash
# Benchmark of the client services (not part of the tests): requests/s of POST /payments with the idempotency
# middleware (a fresh key per request) against the same service's bare transactional handler POST
# /payments-unprotected, with fsync on and off, for this checkout and (BENCH_BEFORE=REV) an older revision, in one
# run per language, rounds rotated, medians and ratios written to bench/clients/RESULTS.md. As root on Debian 12,
# after `make install` of this checkout's extension into the PostgreSQL at PG_BIN. Knobs (bench.py's docstring):
# BENCH_CONNECTIONS (8), BENCH_ROUNDS (3), BENCH_SECONDS (5), BENCH_THREADS (2), BENCH_LANGS (go,node,python; also java, ruby-sinatra, ruby-rails),
# BENCH_FSYNC (both|on|off), BENCH_BEFORE (a revision; b5ec4af is 1.2), BENCH_BEFORE_PG, BENCH_PGBOUNCER (0|1),
# BENCH_OUT. Takes about (configurations x rounds x (seconds + 1) + 40 s) per language, plus building the old
# revision's extension and services once (8 configurations with BENCH_BEFORE and both fsyncs). Stops everything
# it started.
#   BENCH_BEFORE=b5ec4af nice bench/clients/run.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/../../scripts/install-deps.sh" clients java ruby
exec /usr/bin/python3 "$here/bench.py"
