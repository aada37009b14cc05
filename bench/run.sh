#!/usr/bin/env bash
# Benchmarks the extension against a hand-written PL/pgSQL implementation of the same API
# (bench/plpgsql_baseline.sql), a floor (trivial statements where claim and complete would be) and a bare
# request without idempotency, on a throwaway cluster this script starts and removes.
# Writes bench/out/results.csv, results.md (README-ready), ratios.png, and prints the tables.
#
# Settings (environment):
#   BENCH_ROUNDS=5 BENCH_SECONDS=10     rounds per configuration, seconds per pgbench run
#   BENCH_CLIENTS="1 2 4" BENCH_SYNC="on off" BENCH_WORKLOADS="new proc replay mix"
#   BENCH_EXTRAS="wal size hash"        the other measurements; "" skips them
#   BENCH_WAL_TXNS=10000 BENCH_SIZE_KEYS=1000000 BENCH_HASH_REPS=5
#   BENCH_QUICK=1                       2 rounds x 3 s, clients 1 2, smaller extras
#   BENCH_PORT=55433 BENCH_DIR=<temp dir> BENCH_KEEP=1 (leave the cluster's directory behind)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

command_line="$( (env | grep -E '^BENCH_[A-Z_]+=' | sort | sed -E "s/=(.*)/='\1'/" | tr '\n' ' ') || true)bench/run.sh"
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    defaults=(2 3 "1 2" 2000 100000 3)
else
    defaults=(5 10 "1 2 4" 10000 1000000 5)
fi
rounds=${BENCH_ROUNDS:-${defaults[0]}}
seconds=${BENCH_SECONDS:-${defaults[1]}}
clients=${BENCH_CLIENTS:-${defaults[2]}}
wal_txns=${BENCH_WAL_TXNS:-${defaults[3]}}
size_keys=${BENCH_SIZE_KEYS:-${defaults[4]}}
hash_reps=${BENCH_HASH_REPS:-${defaults[5]}}
syncs=${BENCH_SYNC:-on off}
workloads=${BENCH_WORKLOADS:-new proc replay mix}
extras=${BENCH_EXTRAS-wal size hash}
port=${BENCH_PORT:-55433}
dir=${BENCH_DIR:-$(mktemp -d /tmp/idem-bench.XXXXXX)}
out=bench/out
mkdir -p "$out"
raw=$out/raw.csv

# Request parameters: 36-character keys (17-character prefix + 19 digits), a 64-hex hash, a ~110-byte body.
# Key numbers: 1e18+n the 100k completed keys of replay, 2e18..9e18 random new keys, 3e18+n held keys of mix.
kp=bench-key-000000-
body='{"payment_id":"pay_7Hk2N9xQ4mB8vR1s","status":"succeeded","amount_cents":1999,"currency":"EUR","captured":true}'
first_key=1000000000000000001
held_key=3000000000000000000

variants_of() {
    case $1 in
        new | proc) echo bare floor plpgsql extension ;;
        replay | mix) echo floor plpgsql extension ;;
        *) echo "unknown workload $1" >&2; exit 1 ;;
    esac
}


holder_pid=
cleanup() {
    [ -n "$holder_pid" ] && { touch "$dir/holder.stop"; wait "$holder_pid" || true; }
    [ "${BENCH_KEEP:-0}" = 1 ] || stop_cluster "$dir"
}
trap cleanup EXIT

start_throughput_cluster
q -d bench -c "CREATE EXTENSION idempotency" -c "CREATE EXTENSION dblink" \
    -f bench/plpgsql_baseline.sql -f bench/setup.sql >/dev/null
h=$(qv -d bench -c "SELECT idem_hash('$body'::jsonb)")

echo "== parity: the baseline must answer every scenario exactly as the extension"
for api in public plpgsql_idem; do
    q -d bench -v api=$api -v conninfo="host=$dir port=$port dbname=bench user=postgres" \
        -f bench/parity.sql >"$dir/parity_$api.out" 2>&1
done
if ! diff "$dir/parity_public.out" "$dir/parity_plpgsql_idem.out"; then
    echo "parity failed: bench/plpgsql_baseline.sql differs from the extension (diff above)"
    exit 1
fi
grep -q "ERROR:  40001" "$dir/parity_public.out" || { echo "parity: no 40001 case ran"; exit 1; }

echo "== loading 100k completed keys per implementation"
for api in extension plpgsql; do
    q -d bench -c "CALL bench.load_keys('$api', '$kp', $first_key, 100000, '$h', '$body')"
done
q -d bench -c "VACUUM ANALYZE"

# Mix's in-flight duplicates: a session claims 100 keys in both implementations and idles in its
# transaction until the end (no snapshot or xid kept, so it holds back nothing else).
{
    echo "BEGIN;"
    for api in public plpgsql_idem; do
        echo "SELECT count(*) FROM generate_series(1, 100) i, $api.idem_claim('$kp' || ($held_key + i), '$h');"
    done
    while [ ! -e "$dir/holder.stop" ]; do sleep 0.2; done
    echo "ROLLBACK;"
} | q -d bench >/dev/null &
holder_pid=$!
until [ "$(qv -d bench -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")" -ge 200 ]; do
    sleep 0.2
done
# The paths each workload means to measure: replay, in_progress (held), claimed.
check="SELECT string_agg(outcome, ' ' ORDER BY i) FROM (VALUES (1, $first_key), (2, $held_key + 1), (3, 2 * $held_key)) v(i, n),"
for api in public plpgsql_idem; do
    answers=$(qv -d bench -c "BEGIN" -c "$check LATERAL $api.idem_claim('$kp' || n, '$h')" -c "ROLLBACK")
    [ "$answers" = "replay in_progress claimed" ] || { echo "$api answers '$answers'"; exit 1; }
done

pgbench_run() {  # pgbench_run SCRIPT SYNC PGBENCH-ARGS...: prints the tps
    local script=$1 sync=$2 log=$dir/pgbench.log
    shift 2
    if ! PGOPTIONS="-c synchronous_commit=$sync" pgbench -n -M prepared -h "$dir" -p "$port" -U postgres \
        "$@" -f "bench/pgbench/$script.sql" -D kp=$kp -D h=$h -D "body=$body" -D last=$first_key bench \
        >"$log" 2>&1 || ! grep -q "number of failed transactions: 0 " "$log"; then
        cat "$log" >&2
        echo "pgbench $script failed" >&2
        return 1
    fi
    sed -nE 's/^tps = ([0-9.]+) .*/\1/p' "$log"
}

echo "section,workload,sync,clients,variant,round,metric,value" >"$raw"
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "machine=$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2 / 1048576}' /proc/meminfo)"
    echo "postgres=$(qv -d bench -c 'SHOW server_version')"
    echo "command=$command_line"
    echo "matrix=$rounds rounds x $seconds s, clients: $clients, synchronous_commit: $syncs"
    echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/meta.txt"

if [[ " $extras " == *" wal "* ]]; then
    echo "== WAL per request: $wal_txns requests after a CHECKPOINT and a warm-up of the same size"
    for w in $workloads; do
        for v in $(variants_of "$w"); do
            q -d bench -c "CHECKPOINT"
            pgbench_run "${w}_$v" on -c 1 -t "$wal_txns" >/dev/null
            before=$(qv -d bench -c "SELECT pg_current_wal_insert_lsn() || ' ' || wal_fpi || ' ' || wal_records FROM pg_stat_wal")
            pgbench_run "${w}_$v" on -c 1 -t "$wal_txns" >/dev/null
            sleep 1  # pgbench's backend reports its WAL counters as it exits
            read -r bytes fpi records < <(qv -d bench -c "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), split_part(b, ' ', 1)::pg_lsn) / $wal_txns,
                    (wal_fpi - split_part(b, ' ', 2)::bigint)::numeric / $wal_txns,
                    (wal_records - split_part(b, ' ', 3)::bigint)::numeric / $wal_txns
                FROM pg_stat_wal, (SELECT '$before'::text AS b) x" -F ' ')
            printf '%-7s %-10s %8.0f bytes %6.2f FPI %6.2f records per request\n' "$w" "$v" "$bytes" "$fpi" "$records"
            for m in "bytes_per_request $bytes" "fpi_per_request $fpi" "records_per_request $records"; do
                set -- $m
                echo "wal,$w,on,1,$v,1,$1,$2" >>"$raw"
            done
        done
    done
fi

echo "== throughput: $rounds rounds x $seconds s, variants alternating within each round"
for w in $workloads; do
    # A replay writes nothing, so synchronous_commit cannot matter: run it once.
    w_syncs=$syncs
    [ "$w" = replay ] && w_syncs=${syncs%% *}
    for sync in $w_syncs; do
        for c in $clients; do
            for r in $(seq "$rounds"); do
                line="$w sync=$sync clients=$c round $r:"
                for v in $(variants_of "$w"); do
                    q -d bench -c "CHECKPOINT"
                    tps=$(pgbench_run "${w}_$v" "$sync" -c "$c" -j "$c" -T "$seconds")
                    echo "tps,$w,$sync,$c,$v,$r,tps,$tps" >>"$raw"
                    line+=" $v $(printf '%.0f' "$tps")"
                done
                echo "$line"
            done
        done
    done
done

if [[ " $extras " == *" size "* ]]; then
    echo "== size of $size_keys completed keys (random UUIDs, ~110-byte bodies) per implementation"
    q -d postgres -c "CREATE DATABASE bench_size"
    q -d bench_size -c "CREATE EXTENSION idempotency" -f bench/plpgsql_baseline.sql -f bench/setup.sql >/dev/null
    for api in extension plpgsql; do
        table=public.idempotency_keys
        [ $api = plpgsql ] && table=plpgsql_idem.idempotency_keys
        start=$(date +%s.%N)
        q -d bench_size -c "CALL bench.load_keys('$api', '', 0, $size_keys, '$h', '$body', true)"
        end=$(date +%s.%N)
        read -r total heap index < <(qv -d bench_size -F ' ' -c "SELECT pg_total_relation_size('$table') * 1e6 / $size_keys,
            pg_table_size('$table') * 1e6 / $size_keys, pg_indexes_size('$table') * 1e6 / $size_keys")
        rate=$(awk -v n="$size_keys" -v a="$start" -v b="$end" 'BEGIN {printf "%.0f", n / (b - a)}')
        awk -v a="$api" -v t="$total" -v h="$heap" -v i="$index" -v r="$rate" 'BEGIN {
            printf "%-10s %6.1f MB per million keys (table %.1f, index %.1f); loaded %s keys/s in one session\n",
                a, t / 1e6, h / 1e6, i / 1e6, r }'
        for m in "total_bytes_per_million_keys $total" "table_bytes_per_million_keys $heap" \
            "index_bytes_per_million_keys $index" "load_keys_per_s $rate"; do
            set -- $m
            echo "size,-,on,1,$api,1,$1,$2" >>"$raw"
        done
    done
fi

if [[ " $extras " == *" hash "* ]]; then
    echo "== hash throughput: 100 MB in 1 KB or 1 MB payloads, in memory, $hash_reps repetitions"
    for size in 1024 1048576; do
        label=1KB
        [ $size = 1048576 ] && label=1MB
        for r in $(seq 0 "$hash_reps"); do  # round 0 warms up and is not kept
            for fn in idem_hash sha256 plpgsql_idem_hash; do
                mbs=$(qv -d bench -c "SELECT round(bench.hash_mb_per_s('$fn', $size, 100000000)::numeric, 1)")
                [ "$r" = 0 ] || echo "hash,$label,-,1,$fn,$r,mb_per_s,$mbs" >>"$raw"
            done
        done
    done
fi

echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/meta.txt"
perl bench/report.pl "$out"
