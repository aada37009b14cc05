#!/usr/bin/env bash
# Lease mode (1.1) against the floor of the same round trips and the 1.0 transactional request, on a throwaway
# cluster this script starts and removes. Per request (one pgbench transaction):
#   lease   bench/lease/lease_extension.sql: BEGIN; idem_lease; COMMIT; BEGIN; ledger insert;
#           idem_lease_complete with the token; COMMIT (7 round trips, 2 commits)
#   floor   bench/lease/lease_floor.sql: the same two transactions with a plain INSERT of the key row as a lease
#           and a plain UPDATE completing it, into a copy of idempotency_keys; no extension
#   txn10   bench/pgbench/new_extension.sql: the 1.0 request, claim + ledger insert + complete in one
#           transaction (5 round trips, 1 commit)
# The variants alternate within each round; the summary gives medians over the rounds.
# Writes bench/lease/out/raw.csv and summary.md, and prints them.
#
# Settings (environment):
#   LEASE_ROUNDS=5 LEASE_SECONDS=10 LEASE_CLIENTS="1 2" LEASE_SYNC="on off" LEASE_WAL_TXNS=5000
#   LEASE_KEYS=100000          completed keys loaded into each key table before the runs
#   LEASE_PORT=55530 LEASE_DIR=<temp dir> LEASE_KEEP=1 (leave the cluster's directory behind)
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib.sh

command_line="$( (env | grep -E '^LEASE_[A-Z_]+=' | sort | sed -E "s/=(.*)/='\1'/" | tr '\n' ' ') || true)bench/lease/run.sh"
rounds=${LEASE_ROUNDS:-5}
seconds=${LEASE_SECONDS:-10}
clients=${LEASE_CLIENTS:-1 2}
syncs=${LEASE_SYNC:-on off}
wal_txns=${LEASE_WAL_TXNS:-5000}
keys=${LEASE_KEYS:-100000}
port=${LEASE_PORT:-55530}
dir=${LEASE_DIR:-$(mktemp -d /tmp/idem-lease-bench.XXXXXX)}
out=bench/lease/out
mkdir -p "$out"
raw=$out/raw.csv
variants="lease floor txn10"

# The parameters of bench/run.sh: 36-character keys, a 64-hex hash, a ~110-byte body.
kp=bench-key-000000-
body='{"payment_id":"pay_7Hk2N9xQ4mB8vR1s","status":"succeeded","amount_cents":1999,"currency":"EUR","captured":true}'
first_key=1000000000000000001

script_of() {
    case $1 in
        lease) echo bench/lease/lease_extension.sql ;;
        floor) echo bench/lease/lease_floor.sql ;;
        txn10) echo bench/pgbench/new_extension.sql ;;
        *) echo "unknown variant $1" >&2; exit 1 ;;
    esac
}


cleanup() { [ "${LEASE_KEEP:-0}" = 1 ] || stop_cluster "$dir"; }
trap cleanup EXIT

start_throughput_cluster
q -d bench -c "CREATE EXTENSION idempotency" -f bench/setup.sql -f bench/lease/setup.sql >/dev/null
version=$(qv -d bench -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
[ "$version" = 1.1 ] || { echo "extension at $version, not 1.1"; exit 1; }
h=$(qv -d bench -c "SELECT idem_hash('$body'::jsonb)")

echo "== loading $keys completed keys into idempotency_keys and into the floor's table"
q -d bench -c "CALL bench.load_keys('extension', '$kp', $first_key, $keys, '$h', '$body')"
q -d bench -c "CALL bench.load_floor_keys('$kp', $first_key, $keys, '$h', '$body')"
q -d bench -c "VACUUM ANALYZE"

pgbench_run() {  # pgbench_run VARIANT SYNC PGBENCH-ARGS...: prints the tps
    local variant=$1 sync=$2 log=$dir/pgbench.log
    shift 2
    if ! PGOPTIONS="-c synchronous_commit=$sync" pgbench -n -M prepared -h "$dir" -p "$port" -U postgres \
        "$@" -f "$(script_of "$variant")" -D kp=$kp -D h=$h -D "body=$body" bench \
        >"$log" 2>&1 || ! grep -q "number of failed transactions: 0 " "$log"; then
        cat "$log" >&2
        echo "pgbench $variant failed" >&2
        return 1
    fi
    sed -nE 's/^tps = ([0-9.]+) .*/\1/p' "$log"
}

# Every request must end as a completed row: no lease left open, one row per request.
rows() { qv -d bench -c "SELECT (SELECT count(*) FROM public.idempotency_keys) + (SELECT count(*) FROM bench.lease_floor)"; }
open_leases() {
    qv -d bench -c "SELECT (SELECT count(*) FROM public.idempotency_keys WHERE lease_until IS NOT NULL OR http_status IS NULL)
        + (SELECT count(*) FROM bench.lease_floor WHERE lease_until IS NOT NULL OR http_status IS NULL)"
}
echo "== check: 100 requests of each variant complete their key"
for v in $variants; do
    before=$(rows)
    pgbench_run "$v" on -c 1 -t 100 >/dev/null
    [ $(($(rows) - before)) = 100 ] || { echo "$v: $(($(rows) - before)) rows for 100 requests"; exit 1; }
done
[ "$(open_leases)" = 0 ] || { echo "$(open_leases) leases left open"; exit 1; }
[ "$(qv -d bench -c "SELECT leases FROM idem_stats")" = 100 ] || { echo "idem_stats.leases is not 100"; exit 1; }

echo "section,sync,clients,variant,round,metric,value" >"$raw"
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "machine=$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2 / 1048576}' /proc/meminfo)"
    echo "postgres=$(qv -d bench -c 'SHOW server_version')"
    echo "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src extension || echo ' (src or extension modified)')"
    echo "command=$command_line"
    echo "matrix=$rounds rounds x $seconds s, clients: $clients, synchronous_commit: $syncs, $keys keys loaded"
    echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/meta.txt"

echo "== WAL per request: $wal_txns requests after a CHECKPOINT and a warm-up of the same size (1 client, synchronous_commit on)"
for v in $variants; do
    q -d bench -c "CHECKPOINT"
    pgbench_run "$v" on -c 1 -t "$wal_txns" >/dev/null
    before=$(qv -d bench -c "SELECT pg_current_wal_lsn() || ' ' || wal_fpi || ' ' || wal_records FROM pg_stat_wal")
    pgbench_run "$v" on -c 1 -t "$wal_txns" >/dev/null
    sleep 1  # pgbench's backend reports its WAL counters as it exits
    read -r bytes fpi records < <(qv -d bench -F ' ' -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), split_part(b, ' ', 1)::pg_lsn) / $wal_txns,
            (wal_fpi - split_part(b, ' ', 2)::bigint)::numeric / $wal_txns,
            (wal_records - split_part(b, ' ', 3)::bigint)::numeric / $wal_txns
        FROM pg_stat_wal, (SELECT '$before'::text AS b) x")
    printf '%-6s %8.0f bytes %6.2f FPI %6.2f records per request\n' "$v" "$bytes" "$fpi" "$records"
    for m in "bytes_per_request $bytes" "fpi_per_request $fpi" "records_per_request $records"; do
        set -- $m
        echo "wal,on,1,$v,1,$1,$2" >>"$raw"
    done
done

echo "== throughput: $rounds rounds x $seconds s, variants alternating within each round (order rotates per round)"
for sync in $syncs; do
    for c in $clients; do
        for r in $(seq "$rounds"); do
            # Rotate the order so no variant always runs first after the load's quiet spell.
            set -- $variants
            case $((r % 3)) in
                1) order="$1 $2 $3" ;;
                2) order="$2 $3 $1" ;;
                0) order="$3 $1 $2" ;;
            esac
            line="sync=$sync clients=$c round $r:"
            for v in $order; do
                q -d bench -c "CHECKPOINT"
                tps=$(pgbench_run "$v" "$sync" -c "$c" -j "$c" -T "$seconds")
                echo "tps,$sync,$c,$v,$r,tps,$tps" >>"$raw"
                line+=" $v $(printf '%.0f' "$tps")"
            done
            echo "$line"
        done
    done
done
[ "$(open_leases)" = 0 ] || { echo "$(open_leases) leases left open after the runs"; exit 1; }
echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/meta.txt"

perl bench/lease/report.pl "$out"
