#!/usr/bin/env bash
# Instructions per request of the delegated post_payment (test/citus/schema.sql) on a Citus worker, counted by
# callgrind: the key store through SQL statements that Citus plans and routes to the local shard
# (idempotency.citus_direct = off) against the direct path on the local shard under Citus's shard metadata lock
# (on), and post_payment_bare (the same debit without a key) as the floor. Counts are noise-free where tps is not.
#
# A coordinator and one worker that holds every shard; the worker runs under valgrind (callgrind follows the
# postmaster's forks: one file per backend). Each case is two sessions on the worker, one of W warm-up payments and
# one of W + N: the difference over N is the backend's own work per request, start-up and warm-up cancelled out.
# Client round trips are not counted. Run as root; ports CITUS_INSTR_PORT (56130) and the next.
#   CITUS_INSTR_N (300) payments per case; CITUS_INSTR_KEEP=DIR keeps each session's callgrind file there
#   (named CASE.COUNT) for callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=${IDEM_PG_ROOT:-/opt/idem-pg}/17
PG_BIN=$prefix/bin
source scripts/lib/cluster.sh

n=${CITUS_INSTR_N:-300}
warm=50
base_port=${CITUS_INSTR_PORT:-56130}
declare -A port=([coordinator]=$base_port [worker]=$((base_port + 1)))
work=$(mktemp -d /tmp/idem-citus-instr.XXXXXX)
chmod 755 "$work"
valgrind_pid=
cleanup() {
    stop_cluster "$work/worker"
    stop_cluster "$work/coordinator"
    [ -z "$valgrind_pid" ] || wait "$valgrind_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

[ -f "$prefix/.idem-citus-built" ] || { echo "run scripts/build-citus.sh first" >&2; exit 1; }
copy_source_tree "$work/src"
nice -n 10 make -C "$work/src" -s -j2 PG_CONFIG="$PG_BIN/pg_config" >/dev/null
make -C "$work/src" -s PG_CONFIG="$PG_BIN/pg_config" install >/dev/null

q() { local node=$1; shift; "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "${port[$node]}" -U postgres -d app -v ON_ERROR_STOP=1 "$@"; }
settings=("shared_preload_libraries = 'citus,idempotency'" "max_prepared_transactions = 100"
          "idempotency.databases = 'app'" "citus.shard_replication_factor = 1")
for node in coordinator worker; do
    start_cluster "$work/$node" "${port[$node]}" "${settings[@]}"
    "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "${port[$node]}" -U postgres -d postgres -c "CREATE DATABASE app"
    q "$node" -c "CREATE EXTENSION citus"
done
q coordinator -c "SELECT citus_set_coordinator_host('127.0.0.1', ${port[coordinator]})" \
    -c "SELECT citus_add_node('127.0.0.1', ${port[worker]})" >/dev/null
q coordinator -c "CREATE EXTENSION idempotency"
[ "$(q coordinator -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" = 1.3 ] ||
    q coordinator -c "ALTER EXTENSION idempotency UPDATE TO '1.3'"
q coordinator -f test/citus/schema.sql -f test/citus/distribute.sql -c "SELECT idem_citus_distribute('accounts')" >/dev/null

# The worker again, under callgrind.
cluster_ctl "$work/worker" stop
chown postgres "$work"
su postgres -c "cd '$work' && exec valgrind --tool=callgrind --callgrind-out-file='$work/cg.%p' \
    '$PG_BIN/postgres' -D '$work/worker/data'" >"$work/valgrind.log" 2>&1 &
valgrind_pid=$!
for _ in $(seq 240); do
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "${port[worker]}" && break
    sleep 1
done
"$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "${port[worker]}" || { tail "$work/valgrind.log" >&2; exit 1; }

# One session of COUNT payments after the warm-up; prints the total instructions of its backend.
session() {  # session FUNCTION DIRECT COUNT
    local function=$1 direct=$2 count=$3 pid file i
    pid=$(
        {
            echo "SET idempotency.citus_direct = $direct;"
            echo "SELECT pg_backend_pid();"
            for ((i = 0; i < warm + count; i++)); do
                echo "SELECT $function('acct-$((1 + i % 40))', 'instr-$function-$direct-$count-$i', 5);"
            done
        } | q worker | sed -n 1p
    )
    file=$work/cg.$pid
    for _ in $(seq 120); do
        [ -s "$file" ] && grep -q '^totals:\|^summary:' "$file" && break
        sleep 0.5
    done
    [ -z "${CITUS_INSTR_KEEP:-}" ] || { mkdir -p "$CITUS_INSTR_KEEP"; cp "$file" "$CITUS_INSTR_KEEP/$function-$direct.$count"; }
    sed -nE 's/^(summary|totals): ([0-9]+)/\2/p' "$file" | head -1
}

printf "%-34s %14s\n" case instr/request
for c in "post_payment_bare on" "post_payment off" "post_payment on"; do
    read -r function direct <<<"$c"
    base=$(session "$function" "$direct" 0)
    full=$(session "$function" "$direct" "$n")
    label="$function"
    [ "$function" = post_payment ] && label="$function, citus_direct = $direct"
    printf "%-34s %14d\n" "$label" $(((full - base) / n))
done
q coordinator -c "SELECT count(*) || ' payments, ' || count(DISTINCT payment_key) || ' keys' FROM ledger"
