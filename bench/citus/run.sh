#!/usr/bin/env bash
# post_payment (test/citus/schema.sql: claim, debit, ledger row, completion in one transaction) on one PostgreSQL 17
# node against the same function delegated by Citus 14.0.1 on a coordinator and two workers, in the same run:
# alternating windows of CITUS_BENCH_SECONDS (15) with CITUS_BENCH_CLIENTS (8) pgbench clients, CITUS_BENCH_ROUNDS (3)
# rounds of three windows each:
#   single       one node, no Citus
#   coordinator  every client on the coordinator, which delegates each call to the worker of its account
#   workers      clients spread over both workers (libpq load_balance_hosts), each call delegated from there
#   workers_sql  the same with idempotency.citus_direct = off on every node: the key store's SQL statements,
#                routed by Citus, instead of the direct path on the local shard
# Every payment is a new key of one of 40 accounts. Prints each window's tps and, per mode, the median; then per
# worker and projected to N workers. Run as root; ports 56120-56123. Needs scripts/build-citus.sh done.
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=${IDEM_PG_ROOT:-/opt/idem-pg}/17
PG_BIN=$prefix/bin
source scripts/lib/cluster.sh

seconds=${CITUS_BENCH_SECONDS:-15}
clients=${CITUS_BENCH_CLIENTS:-8}
rounds=${CITUS_BENCH_ROUNDS:-3}
work=$(mktemp -d /tmp/idem-citus-bench.XXXXXX)
chmod 755 "$work"
declare -A port=([single]=56120 [coordinator]=56121 [worker1]=56122 [worker2]=56123)
[ "${CITUS_BENCH_KEEP:-0}" = 1 ] || trap 'for n in "${!port[@]}"; do stop_cluster "$work/$n"; done; rm -rf "$work"' EXIT

[ -f "$prefix/.idem-citus-built" ] || { echo "run scripts/build-citus.sh first" >&2; exit 1; }
# Built from a copy: the clone's own objects belong to its PostgreSQL 15 build.
copy_source_tree "$work/src"
nice -n 10 make -C "$work/src" -s -j2 PG_CONFIG="$PG_BIN/pg_config" >/dev/null
make -C "$work/src" -s PG_CONFIG="$PG_BIN/pg_config" install >/dev/null

q() { local node=$1; shift; "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "${port[$node]}" -U postgres -d app -v ON_ERROR_STOP=1 "$@"; }
for n in single coordinator worker1 worker2; do
    preload="'citus,idempotency'"
    [ "$n" = single ] && preload="'idempotency'"
    start_cluster "$work/$n" "${port[$n]}" "shared_preload_libraries = $preload" "max_connections = 100" \
        "max_prepared_transactions = 100" "idempotency.databases = 'app'"
    "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "${port[$n]}" -U postgres -d postgres -c "CREATE DATABASE app"
    [ "$n" = single ] || q "$n" -c "CREATE EXTENSION citus"
done
q single -c "CREATE EXTENSION idempotency" -f test/citus/schema.sql >/dev/null
q coordinator -c "SELECT citus_set_coordinator_host('127.0.0.1', ${port[coordinator]})" \
    -c "SELECT citus_add_node('127.0.0.1', ${port[worker1]})" \
    -c "SELECT citus_add_node('127.0.0.1', ${port[worker2]})" >/dev/null
q coordinator -c "CREATE EXTENSION idempotency"
[ "$(q coordinator -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" = 1.3 ] ||
    q coordinator -c "ALTER EXTENSION idempotency UPDATE TO '1.3'"
q coordinator -f test/citus/schema.sql -f test/citus/distribute.sql -c "SELECT idem_citus_distribute('accounts')" >/dev/null

# pgbench substitutes :a and :k inside the literals: constant arguments, which Citus delegates.
# post_payment_bare is the same debit without a key, the floor of each mode.
for function in post_payment post_payment_bare; do
    printf '%s\n' '\set a random(1, 40)' '\set k random(1, 1000000000000)' \
        "SELECT $function('acct-:a', 'bench-:k', 5);" >"$work/$function.sql"
done
chmod 644 "$work"/*.sql
target() {
    case $1 in
        single) echo "host=127.0.0.1 port=${port[single]} dbname=app user=postgres" ;;
        coordinator) echo "host=127.0.0.1 port=${port[coordinator]} dbname=app user=postgres" ;;
        workers | workers_sql) echo "host=127.0.0.1,127.0.0.1 port=${port[worker1]},${port[worker2]} load_balance_hosts=random dbname=app user=postgres" ;;
    esac
}
# idempotency.citus_direct on every Citus node, for the windows that follow.
set_direct() {
    for n in coordinator worker1 worker2; do
        q "$n" -c "ALTER SYSTEM SET idempotency.citus_direct = $1" -c "SELECT pg_reload_conf()" >/dev/null
    done
    sleep 1
}
modes="single coordinator workers workers_sql"
declare -A results
for round in $(seq "$rounds"); do
    for mode in $modes; do
        if [ "$mode" = workers_sql ]; then set_direct off; else set_direct on; fi
        for function in post_payment post_payment_bare; do
            tps=$("$PG_BIN/pgbench" -n -M simple -c "$clients" -j 2 -T "$seconds" -f "$work/$function.sql" \
                  "$(target $mode)" 2>&1 | awk '/^tps = / {print $3}')
            echo "round $round  $mode  $function  $tps tps"
            results[$mode/$function]+="$tps "
        done
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo
for mode in $modes; do
    with=$(median <<<"${results[$mode/post_payment]}")
    bare=$(median <<<"${results[$mode/post_payment_bare]}")
    declare "tps_$mode=$with"
    awk -v m="$mode" -v w="$with" -v b="$bare" 'BEGIN {
        printf "%-12s median tps: post_payment %.0f, post_payment_bare (no key) %.0f: the key costs %.0f%% of the rate\n",
               m, w, b, 100 * (1 - w / b) }'
done
awk -v s="$tps_single" -v c="$tps_coordinator" -v w="$tps_workers" -v q="$tps_workers_sql" 'BEGIN {
    printf "post_payment on Citus / on one node: %.2fx through the coordinator, %.2fx through the workers\n", c / s, w / s
    printf "through the workers, direct path / SQL path: %.2fx\n", w / q
    printf "per worker (2 workers): %.0f tps through the coordinator, %.0f through the workers\n", c / 2, w / 2
}'
echo "(the four servers and pgbench share this machine's $(nproc) cores: see the README, Scaling out with Citus)"
