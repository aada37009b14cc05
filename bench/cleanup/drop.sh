#!/usr/bin/env bash
# Dropping a big expired partition while clients claim (issue 39): claims at a fixed rate in partitioned storage
# (1-hour partitions) while idem_drop_expired_partitions() drops an expired partition of millions of keys half way
# through. Per repetition: the slowest claim overlapping the drop call, p99 of all claims, the call's duration, the
# calls made (a call that drops nothing is made again, as the next sweep would) and the lock tries inside them
# (1.4 asks for a lock again within a call; its DEBUG1 message "dropped partition ... at try N" says how often),
# and the longest lock wait of a claim from the server log (log_lock_waits, deadlock_timeout 20 ms): the time the
# drop held claims, apart from the CPU they share with the rest of the machine (the slowest claim includes both).
# Writes bench/out/cleanup_drop/results.{csv,md} and prints a table.
#   bench/cleanup/drop.sh                              8 million keys, 2 repetitions
#   CLEANUP_DROP_KEYS=1000000 bench/cleanup/drop.sh    fewer keys (a smaller machine, a smoke run)
# Knobs: CLEANUP_DROP_KEYS (8000000), CLEANUP_BENCH_REPS (2), CLEANUP_BENCH_RATE (200 claims/s over all clients;
# 0 = as fast as possible), CLEANUP_BENCH_CLIENTS (2), CLEANUP_BENCH_PGBENCH_SECONDS (30), CLEANUP_BENCH_PORT (5578),
# CLEANUP_BENCH_DIR (/tmp/cleanbench_drop; its data/ and work/ are deleted), CLEANUP_BENCH_OUT, PGBIN.
# Target (issue 39): the slowest claim overlapping the drop at most 300 ms, the drop done within the call.
# Needs the extension installed (make install) and runs as root.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PART_KEYS=${CLEANUP_DROP_KEYS:-8000000}
REPS=${CLEANUP_BENCH_REPS:-2}
PORT=${CLEANUP_BENCH_PORT:-5578}
DIR=${CLEANUP_BENCH_DIR:-/tmp/cleanbench_drop}
OUT=${CLEANUP_BENCH_OUT:-$HERE/../out/cleanup_drop}
PGB_SECONDS=${CLEANUP_BENCH_PGBENCH_SECONDS:-30}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
RATE=${CLEANUP_BENCH_RATE:-200}
CLIENTS=${CLEANUP_BENCH_CLIENTS:-2}
BATCH=200
DB=cleanbench
COMMAND="$(env | grep -o '^CLEANUP_\(BENCH\|DROP\)_[A-Z_]*=.*' | sort | tr '\n' ' ' || true)bench/cleanup/drop.sh"

source "$HERE/lib.sh"
start_work
start_bench_cluster
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
SO=$("$PGBIN/pg_config" --pkglibdir)/idempotency.so
VERSION="installed idempotency.so md5 $(md5sum < "$SO" | cut -c1-12), repo HEAD $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# Every lock wait past 20 ms is logged with its length ("acquired ... after N ms"): how long the drop held claims,
# apart from the CPU the claims share with everything else on the machine.
set_reload log_lock_waits on
set_reload deadlock_timeout 20ms
say "switching to partitioned storage (1-hour partitions)"
val "SELECT public.idem_set_storage('partitioned', interval '1 hour')" >/dev/null

# One expired partition (the hour three hours ago) of $PART_KEYS keys, each expired within it; as idem_complete
# writes them (UUID keys, 32-byte hash, ~110-byte body), then vacuumed and checkpointed.
load_partition() {
    psql_q -v n="$PART_KEYS" >/dev/null <<'EOF'
SELECT public.idem_create_partition(date_trunc('hour', now()) - interval '3 hours',
                                    date_trunc('hour', now()) - interval '2 hours') AS partition \gset
INSERT INTO public.idempotency_keys_partitioned
    (expires_at, created_at, http_status, scope, key, request_hash, response_headers, response_body)
SELECT date_trunc('hour', now()) - interval '3 hours' + (g % 3600) * interval '1 second',
       date_trunc('hour', now()) - interval '27 hours', 201, '', gen_random_uuid()::text, sha256(int8send(g)),
       '{"content-type": "application/json"}',
       jsonb_build_object('id', 'pay_' || g, 'object', 'payment', 'amount', g % 100000, 'currency', 'eur',
                          'status', 'succeeded')
FROM generate_series(1, :n) g;
VACUUM ANALYZE public.:"partition";
CHECKPOINT;
EOF
}

declare -a MAXW MAXB LOCKW P99 DROP_MS CALLS TRIES
for rep in $(seq 1 "$REPS"); do
    say "repetition $rep/$REPS: loading $PART_KEYS keys into an expired partition"
    t_load=$(now_epoch)
    load_partition
    say "  loaded in $(calc "$(now_epoch) - $t_load" 0) s; claims for ${PGB_SECONDS}s, the drop at +$((PGB_SECONDS / 2))s"
    t0=$(now_epoch)
    start_pgbench "lat_drop_$rep" "$PGB_SECONDS" "$CLIENTS"
    sleep "$((PGB_SECONDS / 2))"
    calls=0 dropped=0 tries=0
    log_from=$(wc -l < "$DIR/server.log")
    drop_from=$(now_epoch)
    while [ "$dropped" = 0 ] && [ "$calls" -lt 20 ]; do
        calls=$((calls + 1))
        out=$(psql_q -At -c "SET client_min_messages = debug1" \
                     -c "SELECT partitions_dropped FROM public.idem_drop_expired_partitions()" 2>&1)
        dropped=$(echo "$out" | grep -E '^[0-9]+$' | tail -1)
        try=$(echo "$out" | sed -n 's/.*dropped partition .* at try \([0-9]*\).*/\1/p' | tail -1)
        tries=$((tries + ${try:-1}))
    done
    drop_to=$(now_epoch)
    wait_pgbench
    # The longest wait of a claim for a lock (the drop's own waits are for ACCESS EXCLUSIVE); 0: none past 20 ms.
    lockw=$(tail -n +"$((log_from + 1))" "$DIR/server.log" | grep -v AccessExclusiveLock |
            sed -n 's/.*acquired [A-Za-z]*Lock on .* after \([0-9.]*\) ms.*/\1/p' | sort -g | tail -1 || true)
    lockw=${lockw:-0}
    [ "$dropped" = 1 ] || { printf 'the partition was not dropped in %s calls; the last said:\n%s\n' "$calls" "$out" >&2; exit 1; }
    set -- $(latency "lat_drop_$rep" "$drop_from" "$drop_to")
    maxw=$4 overlapping=$1
    # The same machine without the drop: the slowest claim of the 5 s before it (pgbench's own lag shows here too).
    set -- $(latency "lat_drop_$rep" "$(calc "$drop_from - 6" 6)" "$(calc "$drop_from - 1" 6)")
    maxb=$4
    set -- $(latency "lat_drop_$rep" "$(calc "$t0 + 1" 6)" "$(pgbench_end "lat_drop_$rep")")
    p99=$3 tps=$5
    drop_ms=$(calc "($drop_to - $drop_from) * 1000" 0)
    MAXW+=("$maxw") MAXB+=("$maxb") LOCKW+=("$lockw") P99+=("$p99") DROP_MS+=("$drop_ms") CALLS+=("$calls") TRIES+=("$tries")
    csv 3 max_ms_overlapping_drop partition_drop "$rep" "$maxw" ms "<=300" "$(pass "$maxw <= 300")"
    csv 3 longest_claim_lock_wait partition_drop "$rep" "$lockw" ms "<=300" "$(pass "$lockw <= 300")"
    csv 3 max_ms_5s_before_drop partition_drop "$rep" "$maxb" ms
    csv 3 claims_overlapping_drop partition_drop "$rep" "$overlapping" ""
    csv 3 p99_ms partition_drop "$rep" "$p99" ms
    csv 3 claims_per_second partition_drop "$rep" "$tps" txn/s
    csv 3 drop_ms_under_load partition_drop "$rep" "$drop_ms" ms
    csv 3 drop_calls partition_drop "$rep" "$calls" ""
    csv 3 drop_lock_tries partition_drop "$rep" "$tries" ""
    say "  slowest of $overlapping claims overlapping the drop: $maxw ms (5 s before it: $maxb ms), longest lock wait of a claim $lockw ms; p99 $p99 ms ($tps claims/s); drop ${drop_ms} ms, $calls call(s), $tries lock tries"
done

LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
MAX_MAXW=$(printf '%s\n' "${MAXW[@]}" | sort -g | tail -1 || true)
report() {
    echo "| repetition | slowest claim overlapping the drop (target <= 300 ms) | slowest claim in the 5 s before it | longest lock wait of a claim (0: none over 20 ms) | claim p99 | drop call(s) duration | calls | lock tries |"
    echo "|---|---|---|---|---|---|---|---|"
    for i in "${!MAXW[@]}"; do
        echo "| $((i + 1)) | ${MAXW[$i]} ms ($(pass "${MAXW[$i]} <= 300")) | ${MAXB[$i]} ms | ${LOCKW[$i]} ms | ${P99[$i]} ms | ${DROP_MS[$i]} ms | ${CALLS[$i]} | ${TRIES[$i]} |"
    done
}
{
    echo "# Dropping an expired partition of $PART_KEYS keys while $CLIENTS clients claim"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo) RAM; load average $LOAD_START at start, $LOAD_END at end"
    echo "- server: $(val 'SHOW server_version'), shared_buffers 512MB, autovacuum off"
    echo "- command: \`$COMMAND\`"
    echo "- extension: $VERSION"
    echo "- claims: pgbench -M prepared -c $CLIENTS -j $CLIENTS $([ "$RATE" = 0 ] && echo "as fast as it goes" || echo "-R $RATE") -T $PGB_SECONDS, bench/cleanup/claim.pgbench (BEGIN; idem_claim of a new key; idem_complete; COMMIT); the drop is idem_drop_expired_partitions() in autocommit at +$((PGB_SECONDS / 2)) s, called again while it drops nothing"
    echo
    report
    echo
    echo "Slowest over all repetitions: $MAX_MAXW ms."
} > "$WORK/results.md"
echo
report
echo
echo "results: $OUT/results.csv and $OUT/results.md"
