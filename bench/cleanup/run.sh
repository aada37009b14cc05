#!/usr/bin/env bash
# Expiry benchmark on a throwaway cluster: (1) removal rate and WAL of the background worker's
# batched delete vs a hand-written ctid loop, (2) dropping an expired partition, (3) claim latency
# p99 while each cleanup runs. Writes bench/out/cleanup/results.{csv,md} and prints a table.
#   bench/cleanup/run.sh                           full: 2M expired + 2M live keys, 3 repetitions
#   CLEANUP_BENCH_KEYS=200000 bench/cleanup/run.sh smoke run
# Part 3 runs claims at a fixed rate, as a service below saturation sees them, so that p99 is
# service time and not the queue of a saturated closed loop: CLEANUP_BENCH_RATE claims/s in all
# (200; 0 = as fast as possible), at each client count of CLEANUP_BENCH_CLIENTS ('1 2'); the sweep
# there runs at idempotency.cleanup_keys_per_second = CLEANUP_BENCH_PACE (2000), in batches of
# idempotency.cleanup_batch_size = CLEANUP_BENCH_BATCH (200) everywhere; both the defaults.
# Part 1 measures the delete itself, unpaced (cleanup_keys_per_second = 0).
# Other knobs: CLEANUP_BENCH_REPS (3), CLEANUP_BENCH_PGBENCH_SECONDS (20), CLEANUP_BENCH_PORT (5577),
# CLEANUP_BENCH_DIR (/tmp/cleanbench_helper; its data/ and work/ are deleted), CLEANUP_BENCH_OUT.
# Needs the extension installed (make install) and runs as root.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
KEYS=${CLEANUP_BENCH_KEYS:-2000000}
PART_KEYS=$((KEYS / 2))
REPS=${CLEANUP_BENCH_REPS:-3}
PORT=${CLEANUP_BENCH_PORT:-5577}
DIR=${CLEANUP_BENCH_DIR:-/tmp/cleanbench_helper}
OUT=${CLEANUP_BENCH_OUT:-$HERE/../out/cleanup}
if [ -z "${CLEANUP_BENCH_PGBENCH_SECONDS:-}" ]; then
    PGB_SECONDS=$([ "$KEYS" -ge 1000000 ] && echo 20 || echo 10)
else
    PGB_SECONDS=$CLEANUP_BENCH_PGBENCH_SECONDS
fi
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
RATE=${CLEANUP_BENCH_RATE:-200}
CLIENTS=${CLEANUP_BENCH_CLIENTS:-1 2}
PACE=${CLEANUP_BENCH_PACE:-2000}
BATCH=${CLEANUP_BENCH_BATCH:-200}
DB=cleanbench
COMMAND="$(env | grep -o '^CLEANUP_BENCH_[A-Z_]*=.*' | sort | tr '\n' ' ' || true)bench/cleanup/run.sh"

source "$HERE/lib.sh"
start_work

# ---------- cluster ----------
start_bench_cluster
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
# What was measured: the library the postmaster loaded at start, and the tree it should come from.
SO=$("$PGBIN/pg_config" --pkglibdir)/idempotency.so
VERSION="installed idempotency.so md5 $(md5sum < "$SO" | cut -c1-12) ($([ -f "$HERE/../../idempotency.so" ] && cmp -s "$SO" "$HERE/../../idempotency.so" && echo 'byte-identical to' || echo 'not byte-identical to') the repo's build), repo HEAD $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown) with $( (git -C "$HERE" status --porcelain -- ../../src ../../sql 2>/dev/null || true) | wc -l) uncommitted change(s) under src/ and sql/"

say "seed: $KEYS expired + $KEYS live keys"
psql_q -v expired="$KEYS" -v live="$KEYS" -f "$HERE/make_seed.sql"

# ---------- helpers ----------

# FPI bytes in the WAL between two LSNs.
fpi_bytes() {
    val "SELECT coalesce(sum(fpi_size), 0) FROM pg_get_wal_stats('$1', least('$2'::pg_lsn, pg_current_wal_flush_lsn()))"
}

# CPU ticks (user + system) a process has used so far into TICKS, its nice value into NICE; fields
# after "(comm)" in /proc/PID/stat. Builtins only: forking while claims are timed would load the CPUs.
HZ=$(getconf CLK_TCK)
read_ticks() {
    local line
    { read -r line < "/proc/$1/stat"; } 2>/dev/null || return 1
    set -- ${line##*) }
    TICKS=$(( ${12} + ${13} )) NICE=${17}
}
SWEEPER_NICE=unknown

# One sweep of the background worker, started by shortening cleanup_interval and lengthened again
# as soon as the sweep is under way, so exactly one runs. Its CPU time is read from /proc until it
# exits. Prints: ms removed wal_bytes fpi_bytes start_epoch end_epoch cpu_s nice
worker_sweep() {
    local before l0 l1 i row pid ticks=
    before=$(last_sweep)
    l0=$(val "SELECT pg_current_wal_lsn()")
    set_interval 1s
    for i in $(seq 1 1000); do
        pid=$(val "SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup'")
        [ -n "$pid" ] || [ "$(last_sweep)" != "$before" ] && break
        sleep 0.02
    done
    set_interval 1h
    local nice=unknown
    while [ -n "$pid" ] && read_ticks "$pid"; do ticks=$TICKS nice=$NICE; sleep 0.05; done
    for i in $(seq 1 100000); do
        [ "$(sweeper_running)" = 0 ] && [ "$(last_sweep)" != "$before" ] && break
        sleep 0.1
    done
    l1=$(val "SELECT pg_current_wal_lsn()")
    row=$(val "SELECT last_sweep_duration_ms, last_sweep_removed, extract(epoch FROM last_sweep_started_at),
                      extract(epoch FROM last_sweep_started_at) + last_sweep_duration_ms / 1000
               FROM public.idem_stats" | tr '|' ' ')
    set -- $row
    echo "$1 $2 $(val "SELECT pg_wal_lsn_diff('$l1', '$l0')") $(fpi_bytes "$l0" "$l1") $3 $4 $([ -n "$ticks" ] && calc "$ticks / $HZ" 2 || echo NA) $nice"
}

# A cleanup run from SQL, timed by psql, with the CPU time of its backend.
# Prints: ms removed wal_bytes fpi_bytes cpu_s
sql_sweep() {
    local out ms rest cpu_file=$RAW/cpu.txt
    : > "$cpu_file"
    out=$(psql_q -At <<EOF
SELECT pg_current_wal_lsn() AS l0, pg_backend_pid() AS pid \gset
\setenv BACKEND_PID :pid
\! sed 's/.*) //' /proc/\$BACKEND_PID/stat | awk '{print \$12 + \$13}' >> $cpu_file
\timing on
$1
\timing off
\! sed 's/.*) //' /proc/\$BACKEND_PID/stat | awk '{print \$12 + \$13}' >> $cpu_file
SELECT pg_current_wal_lsn() AS l1 \gset
SELECT current_setting('cleanup_bench.removed'), pg_wal_lsn_diff(:'l1', :'l0'), :'l0', :'l1';
EOF
)
    ms=$(echo "$out" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1)
    rest=$(echo "$out" | tail -1 | tr '|' ' ')
    set -- $rest
    echo "$ms $1 $2 $(fpi_bytes "$3" "$4") $(awk -v hz="$HZ" 'NR == 1 {a = $1} NR == 2 {printf "%.2f", ($1 - a) / hz}' "$cpu_file")"
}

load_table() { psql_q -f "$HERE/load_keys.sql"; }


# ---------- part 1: removal rate and WAL per key ----------
declare -A RATE WALK FPIK CPURATE
for rep in $(seq 1 "$REPS"); do
    # Alternate the order so that neither variant always runs on a warmer machine.
    if [ $((rep % 2)) = 1 ]; then order="worker baseline idem_cleanup"; else order="baseline worker idem_cleanup"; fi
    for variant in $order; do
        say "part 1, repetition $rep/$REPS: load, then $variant"
        load_table
        case $variant in
            worker) set -- $(worker_sweep); cpu=$7 SWEEPER_NICE=$8 ;;
            baseline) set -- $(sql_sweep "\\i $HERE/baseline_delete.sql"); cpu=$5 ;;
            idem_cleanup) set -- $(sql_sweep "SELECT set_config('cleanup_bench.removed', public.idem_cleanup()::text, false) \\g /dev/null"); cpu=$5 ;;
        esac
        ms=$1 removed=$2 wal=$3 fpi=$4
        if [ "$removed" != "$KEYS" ] || [ "$(val "SELECT count(*) FROM public.idempotency_keys WHERE expires_at <= now()")" != 0 ]; then
            echo "part 1: $variant removed $removed keys, expected $KEYS and none left" >&2; exit 1
        fi
        rate=$(calc "$removed / ($ms / 1000)" 0)
        RATE[$variant]+="$rate " WALK[$variant]+="$(calc "$wal / $removed" 1) " FPIK[$variant]+="$(calc "$fpi / $removed" 1) "
        csv 1 seconds "$variant" "$rep" "$(calc "$ms / 1000")" s
        csv 1 keys_per_second "$variant" "$rep" "$rate" keys/s
        csv 1 wal_bytes_per_key "$variant" "$rep" "$(calc "$wal / $removed" 1)" B/key
        csv 1 fpi_bytes_per_key "$variant" "$rep" "$(calc "$fpi / $removed" 1)" B/key
        # CPU time is steadier than elapsed time when other work shares the machine.
        if [ "$cpu" != NA ] && awk "BEGIN {exit !($cpu > 0)}"; then
            CPURATE[$variant]+="$(calc "$removed / $cpu" 0) "
            csv 1 cpu_seconds "$variant" "$rep" "$cpu" s
            csv 1 keys_per_cpu_second "$variant" "$rep" "$(calc "$removed / $cpu" 0)" keys/s
        fi
        say "  $variant: $removed keys in ${ms} ms = $rate keys/s, $(calc "$wal / $removed" 1) WAL B/key"
    done
done
for variant in worker baseline idem_cleanup; do
    eval "M_RATE_$variant=$(echo "${RATE[$variant]}" | median)"
    eval "M_WAL_$variant=$(echo "${WALK[$variant]}" | median)"
    eval "M_FPI_$variant=$(echo "${FPIK[$variant]}" | median)"
    eval "M_CPU_$variant=$(echo "${CPURATE[$variant]:-0}" | median)"
    csv 1 keys_per_cpu_second "$variant" median "$(eval echo \$M_CPU_$variant)" keys/s
    csv 1 keys_per_second "$variant" median "$(eval echo \$M_RATE_$variant)" keys/s
    csv 1 wal_bytes_per_key "$variant" median "$(eval echo \$M_WAL_$variant)" B/key
    csv 1 fpi_bytes_per_key "$variant" median "$(eval echo \$M_FPI_$variant)" B/key
done
RATE_RATIO=$(calc "$M_RATE_worker / $M_RATE_baseline" 3)
WAL_RATIO=$(calc "$M_WAL_worker / $M_WAL_baseline" 3)
CPU_RATIO=$(calc "$M_CPU_worker / ($M_CPU_baseline + 1e-9)" 3)
csv 1 cpu_rate_ratio worker/baseline median "$CPU_RATIO" x ">=0.8" "$(pass "$CPU_RATIO >= 0.8")"
csv 1 rate_ratio worker/baseline median "$RATE_RATIO" x ">=0.8" "$(pass "$RATE_RATIO >= 0.8")"
csv 1 wal_ratio worker/baseline median "$WAL_RATIO" x "" ""
WORKER_SECONDS=$(calc "$KEYS / $M_RATE_worker" 1)

# ---------- part 3 (table mode): claim latency without cleanup and during the worker's paced sweep ----------
# Each repetition at each client count: fresh data, claims alone, then claims again while the
# worker sweeps at its pace; the window measured is the sweep itself. The sweep's removal rate is
# compared with the rate the claims create keys in the same window.
val "ALTER SYSTEM SET idempotency.cleanup_keys_per_second = $PACE" >/dev/null
val "SELECT pg_reload_conf()" >/dev/null
PACED_SECONDS=$(calc "$KEYS / $PACE + $WORKER_SECONDS" 1)
# 5 s before the sweep, half its expected length again as a margin, 5 s after.
PGB_B=$(calc "5 + 1.5 * $PACED_SECONDS + 5" 0)
# The window without cleanup is as long as the sweep's, so that both p99s come from as many claims.
NONE_SECONDS=$(calc "$PACED_SECONDS + 1" 0)
declare -A P99_A_C P50_A_C TPS_A_C P99_B_C P50_B_C TPS_B_C SWEEP_S_C R_B_C REMOVAL_C RR_C
for clients in $CLIENTS; do
  for rep in $(seq 1 "$REPS"); do
    say "part 3, $clients client(s), repetition $rep/$REPS: load; claims for ${NONE_SECONDS}s without cleanup and ${PGB_B}s with the worker's sweep from +5s ($([ $((rep % 2)) = 1 ] && echo "in that order" || echo "the sweep first"))"
    load_table
    # Odd repetitions measure without cleanup first, even ones with it first, so that neither always runs
    # right after the checkpoint of load_table.
    for condition in $([ $((rep % 2)) = 1 ] && echo "none sweep" || echo "sweep none"); do
      if [ "$condition" = none ]; then
        t0=$(now_epoch)
        start_pgbench "lat_none_c${clients}_$rep" "$NONE_SECONDS" "$clients"
        wait_pgbench
        set -- $(latency "lat_none_c${clients}_$rep" "$(calc "$t0 + 1" 6)" "$(pgbench_end "lat_none_c${clients}_$rep")" "$RAW/pooled_none_c$clients")
        p99_a=$3
        csv 3 p99_ms "none_table_c$clients" "$rep" "$3" ms; csv 3 p50_ms "none_table_c$clients" "$rep" "$2" ms
        csv 3 claims_per_second "none_table_c$clients" "$rep" "$5" txn/s
        P99_A_C[$clients]+="$3 " P50_A_C[$clients]+="$2 " TPS_A_C[$clients]+="$5 "
      else
        start_pgbench "lat_sweep_c${clients}_$rep" "$PGB_B" "$clients"
        sleep 5
        set -- $(worker_sweep)
        sweep_ms=$1 sweep_removed=$2 sweep_from=$5 sweep_to=$6
        wait_pgbench
        [ "$sweep_removed" = "$KEYS" ] || { echo "part 3: the sweep removed $sweep_removed keys, expected $KEYS" >&2; exit 1; }
        awk "BEGIN {exit !($sweep_to <= $(pgbench_end "lat_sweep_c${clients}_$rep"))}" ||
            say "  warning: the sweep outlasted pgbench; the window covers only its start"
        set -- $(latency "lat_sweep_c${clients}_$rep" "$sweep_from" "$sweep_to" "$RAW/pooled_sweep_c$clients")
        sweep_stats="$*"
      fi
    done
    set -- $sweep_stats
    removal=$(calc "$sweep_removed / ($sweep_ms / 1000)" 0)
    csv 3 p99_ms "worker_sweep_c$clients" "$rep" "$3" ms; csv 3 p50_ms "worker_sweep_c$clients" "$rep" "$2" ms
    csv 3 claims_per_second "worker_sweep_c$clients" "$rep" "$5" txn/s
    csv 3 sweep_seconds_under_load "worker_sweep_c$clients" "$rep" "$(calc "$sweep_ms / 1000")" s
    csv 3 removal_keys_per_second "worker_sweep_c$clients" "$rep" "$removal" keys/s
    P99_B_C[$clients]+="$3 " P50_B_C[$clients]+="$2 " TPS_B_C[$clients]+="$5 " SWEEP_S_C[$clients]+="$(calc "$sweep_ms / 1000") "
    REMOVAL_C[$clients]+="$removal "
    # Paired with the run next to it, so that drift in other load on the machine cancels out.
    ratio=$(calc "$3 / $p99_a" 3)
    R_B_C[$clients]+="$ratio "
    RR_C[$clients]+="$(calc "$removal / $5" 1) "
    csv 3 p99_ratio "worker_sweep/none_table_c$clients" "$rep" "$ratio" x
    csv 3 removal_to_creation_ratio "worker_sweep_c$clients" "$rep" "$(calc "$removal / $5" 1)" x
    say "  p99 $p99_a ms alone, $3 ms during the sweep ($(calc "$sweep_ms / 1000" 1) s, $removal keys/s removed, $5 claims/s)"
  done
done
val "ALTER SYSTEM SET idempotency.cleanup_keys_per_second = 0" >/dev/null
val "SELECT pg_reload_conf()" >/dev/null
TABLE_ROWS=
for clients in $CLIENTS; do
    for m in P99_A P50_A TPS_A P99_B P50_B TPS_B SWEEP_S REMOVAL; do
        eval "M_$m=\$(echo \"\${${m}_C[$clients]}\" | median)"
    done
    M_R_B=$(echo "${R_B_C[$clients]}" | median)
    M_RR=$(echo "${RR_C[$clients]}" | median)
    csv 3 p99_ratio "worker_sweep/none_table_c$clients" median "$M_R_B" x "<=1.2" "$(pass "$M_R_B <= 1.2")"
    csv 3 removal_to_creation_ratio "worker_sweep_c$clients" median "$M_RR" x ">=10" "$(pass "$M_RR >= 10")"
    POOLED_A=$(p99_of "$RAW/pooled_none_c$clients") POOLED_B=$(p99_of "$RAW/pooled_sweep_c$clients")
    M_R_POOLED=$(calc "$POOLED_B / $POOLED_A" 3)
    csv 3 p99_ms "none_table_c$clients" pooled "$POOLED_A" ms; csv 3 p99_ms "worker_sweep_c$clients" pooled "$POOLED_B" ms
    csv 3 p99_ratio "worker_sweep/none_table_c$clients" pooled "$M_R_POOLED" x "<=1.2" "$(pass "$M_R_POOLED <= 1.2")"
    P99_A=$M_P99_A    # the last client count, as in the partitioned part
    TABLE_ROWS+="| 3a | $clients client(s): claim p99 / p50, no cleanup, table mode ($M_TPS_A claims/s) | $M_P99_A / $M_P50_A ms | | |
| 3b | $clients client(s): claim p99 / p50 during the paced sweep ($M_TPS_B claims/s, sweep $M_SWEEP_S s) | $M_P99_B / $M_P50_B ms | | |
| 3b | $clients client(s): p99 ratio sweep / none (median of the paired ratios ${R_B_C[$clients]}) | ${M_R_B}x | <= 1.2x | $(pass "$M_R_B <= 1.2") |
| 3b | $clients client(s): p99 ratio sweep / none over all repetitions' claims pooled ($POOLED_B / $POOLED_A ms, $(wc -l < "$RAW/pooled_sweep_c$clients") / $(wc -l < "$RAW/pooled_none_c$clients") claims) | ${M_R_POOLED}x | <= 1.2x | $(pass "$M_R_POOLED <= 1.2") |
| 3b | $clients client(s): keys removed per second during the sweep / keys created per second (median of ${RR_C[$clients]}) | $M_REMOVAL keys/s, ${M_RR}x | >= 10x | $(pass "$M_RR >= 10") |
"
done

# ---------- part 2: dropping an expired partition ----------
say "switching to partitioned storage (1 hour partitions)"
val "TRUNCATE public.idempotency_keys" >/dev/null
val "SELECT public.idem_set_storage('partitioned', interval '1 hour')" >/dev/null
DROP_MS_ALL= DROP_WAL_ALL=
for rep in $(seq 1 "$REPS"); do
    say "part 2, repetition $rep/$REPS: $PART_KEYS keys in an expired partition, then idem_drop_expired_partitions()"
    psql_q -v n="$PART_KEYS" -f "$HERE/load_partition.sql" >/dev/null
    set -- $(sql_sweep "SELECT set_config('cleanup_bench.removed', keys_removed::text, false) FROM public.idem_drop_expired_partitions() \\g /dev/null")
    [ "$2" = "$PART_KEYS" ] || { echo "part 2: dropped $2 keys, expected $PART_KEYS" >&2; exit 1; }
    DROP_MS_ALL+="$1 " DROP_WAL_ALL+="$3 "
    csv 2 drop_ms partition "$rep" "$1" ms
    csv 2 drop_wal_bytes partition "$rep" "$3" B
    say "  dropped $2 keys in $1 ms, $3 WAL bytes"
done
DROP_MS=$(echo "$DROP_MS_ALL" | median)
DROP_WAL=$(echo "$DROP_WAL_ALL" | median)
csv 2 drop_ms partition median "$DROP_MS" ms "<1000" "$(pass "$DROP_MS < 1000")"
csv 2 drop_wal_bytes partition median "$DROP_WAL" B "<1048576" "$(pass "$DROP_WAL < 1048576")"

# ---------- part 3 (partitioned mode): claim latency without cleanup and across a partition drop ----------
for rep in $(seq 1 "$REPS"); do
    say "part 3, repetition $rep/$REPS, partitioned: load an expired partition; claims for ${PGB_SECONDS}s without cleanup, then ${PGB_SECONDS}s dropping it half way"
    psql_q -v n="$PART_KEYS" -f "$HERE/load_partition.sql" >/dev/null
    t0=$(now_epoch)
    start_pgbench "lat_none_partitioned_$rep" "$PGB_SECONDS"
    wait_pgbench
    set -- $(latency "lat_none_partitioned_$rep" "$(calc "$t0 + 1" 6)" "$(pgbench_end "lat_none_partitioned_$rep")")
    csv 3 p99_ms none_partitioned "$rep" "$3" ms; csv 3 p50_ms none_partitioned "$rep" "$2" ms
    csv 3 claims_per_second none_partitioned "$rep" "$5" txn/s
    P99_AP_ALL+="$3 " P50_AP_ALL+="$2 " TPS_AP_ALL+="$5 "

    t0=$(now_epoch)
    start_pgbench "lat_drop_$rep" "$PGB_SECONDS"
    sleep "$((PGB_SECONDS / 2))"
    attempts=0 dropped=0
    # A drop that cannot get its lock within partition_lock_timeout is skipped; try again as the next sweep would.
    while [ "$dropped" = 0 ] && [ "$attempts" -lt 20 ]; do
        attempts=$((attempts + 1))
        drop_from=$(now_epoch)
        dropped=$(val "SELECT partitions_dropped FROM public.idem_drop_expired_partitions()")
        drop_to=$(now_epoch)
    done
    wait_pgbench
    [ "$dropped" = 1 ] || { echo "part 3: the partition was not dropped in $attempts attempts" >&2; exit 1; }
    set -- $(latency "lat_drop_$rep" "$(calc "$t0 + 1" 6)" "$(pgbench_end "lat_drop_$rep")")
    csv 3 p99_ms partition_drop "$rep" "$3" ms; csv 3 p50_ms partition_drop "$rep" "$2" ms
    csv 3 claims_per_second partition_drop "$rep" "$5" txn/s
    P99_C_ALL+="$3 " P50_C_ALL+="$2 " TPS_C_ALL+="$5 " ATTEMPTS_ALL+="$attempts "
    R_CP_ALL+="$(calc "$3 / $(echo "$P99_AP_ALL" | awk '{print $NF}')" 3) "
    csv 3 p99_ratio partition_drop/none_partitioned "$rep" "$(echo "$R_CP_ALL" | awk '{print $NF}')" x
    p99_c=$3
    set -- $(latency "lat_drop_$rep" "$drop_from" "$drop_to")
    csv 3 max_ms_overlapping_drop partition_drop "$rep" "$4" ms
    csv 3 drop_attempts partition_drop "$rep" "$attempts" ""
    csv 3 drop_ms_under_load partition_drop "$rep" "$(calc "($drop_to - $drop_from) * 1000")" ms
    MAXW_ALL+="$4 "
    say "  p99 $(echo "$P99_AP_ALL" | awk '{print $NF}') ms alone, $p99_c ms across the drop (slowest overlapping it: $4 ms, $attempts attempt(s))"
done

for m in P99_AP P50_AP TPS_AP P99_C P50_C TPS_C MAXW; do
    eval "$m=\$(echo \"\$${m}_ALL\" | median)"
done
csv 3 p99_ms none_partitioned median "$P99_AP" ms
csv 3 p99_ms partition_drop median "$P99_C" ms
# Paired ratios: median of the per-repetition ratios. Drop vs table mode is not paired: ratio of medians.
R_C=$(calc "$P99_C / $P99_A" 3)
R_CP=$(echo "$R_CP_ALL" | median)
csv 3 p99_ratio partition_drop/none_table median "$R_C" x "<=1.2" "$(pass "$R_C <= 1.2")"
csv 3 p99_ratio partition_drop/none_partitioned median "$R_CP" x "<=1.2" "$(pass "$R_CP <= 1.2")"

# ---------- report ----------
LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
report() {
    cat <<EOF
| part | measure | value | target | pass |
|---|---|---|---|---|
| 1 | keys/s, worker (batched delete, commit per batch; median of $REPS) | $M_RATE_worker | | |
| 1 | keys/s, baseline ctid loop (median of $REPS) | $M_RATE_baseline | | |
| 1 | keys/s, idem_cleanup() in one transaction (median of $REPS) | $M_RATE_idem_cleanup | | |
| 1 | rate ratio worker / baseline | ${RATE_RATIO}x | >= 0.8x | $(pass "$RATE_RATIO >= 0.8") |
| 1 | keys per CPU-second: worker / baseline / idem_cleanup() | $M_CPU_worker / $M_CPU_baseline / $M_CPU_idem_cleanup | | |
| 1 | same ratio on CPU time, worker / baseline | ${CPU_RATIO}x | >= 0.8x | $(pass "$CPU_RATIO >= 0.8") |
| 1 | WAL bytes/key, worker (of which full-page images) | $M_WAL_worker ($M_FPI_worker) | | |
| 1 | WAL bytes/key, baseline (of which full-page images) | $M_WAL_baseline ($M_FPI_baseline) | | |
| 1 | WAL bytes/key, idem_cleanup() (of which full-page images) | $M_WAL_idem_cleanup ($M_FPI_idem_cleanup) | | |
| 1 | WAL ratio worker / baseline | ${WAL_RATIO}x | | |
| 2 | idem_drop_expired_partitions(), $PART_KEYS keys (median of $REPS) | $DROP_MS ms | < 1000 ms | $(pass "$DROP_MS < 1000") |
| 2 | its WAL | $DROP_WAL B | < 1048576 B | $(pass "$DROP_WAL < 1048576") |
${TABLE_ROWS}| 3a' | claim p99 / p50, no cleanup, partitioned mode ($TPS_AP claims/s) | $P99_AP / $P50_AP ms | | |
| 3c | claim p99 / p50 across a partition drop ($TPS_C claims/s) | $P99_C / $P50_C ms | | |
| 3c | slowest claim overlapping the drop (attempts: $ATTEMPTS_ALL) | $MAXW ms | | |
| 3c | p99 ratio drop / none (table mode, ${CLIENTS##* } clients; ratio of the medians) | ${R_C}x | <= 1.2x | $(pass "$R_C <= 1.2") |
| 3c | p99 ratio drop / none (partitioned mode; median of the paired ratios $R_CP_ALL) | ${R_CP}x | <= 1.2x | $(pass "$R_CP <= 1.2") |
EOF
}
per_repetition() {
    awk -F, -v reps="$REPS" 'NR > 1 && $4 ~ /^[0-9]+$/ {
            k = $1 " | " $2 " | " $3 " | " $6; if (!(k in seen)) { seen[k] = 1; order[++n] = k }; v[k, $4] = $5 }
        END {
            printf "| part | measure | variant | unit |"; for (r = 1; r <= reps; r++) printf " rep %d |", r; print ""
            printf "|---|---|---|---|"; for (r = 1; r <= reps; r++) printf "---|"; print ""
            for (i = 1; i <= n; i++) { printf "| %s |", order[i]; for (r = 1; r <= reps; r++) printf " %s |", v[order[i], r]; print "" }
        }' "$CSV"
}
{
    echo "# Expiry benchmark: batched delete, partition drop, claim latency"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo) RAM, Linux $(uname -r); load average $LOAD_START at start, $LOAD_END at end (other work on the machine shows up here)"
    echo "- server: $(val 'SHOW server_version'), shared_buffers 512MB, synchronous_commit on, autovacuum off, checkpoint_timeout 1h, max_wal_size 16GB"
    echo "- command: \`$COMMAND\`"
    echo "- extension: $VERSION; the sweeper ran at nice $SWEEPER_NICE"
    echo "- data: $KEYS expired + $KEYS live keys (UUID keys, 32-byte hash, ~110-byte jsonb body), expired and live mixed on every heap page; reloaded, VACUUM ANALYZE and CHECKPOINT before every variant (so each pays the same full-page images); partition test: $PART_KEYS keys in one expired 1-hour partition"
    echo "- worker rate from idem_stats.last_sweep_duration_ms / last_sweep_removed (one transaction per batch of idempotency.cleanup_batch_size = $BATCH); baseline and idem_cleanup() timed by psql \\timing; WAL from pg_current_wal_lsn() differences, full-page image share from pg_walinspect"
    echo "- latency: pgbench -M prepared -c N -j N $([ "$RATE" = 0 ] && echo "as fast as it goes" || echo "-R $RATE (a fixed rate in claims/s over all clients; latency counts from the scheduled start, as a client sees it)"), 2 clients in the partitioned part; sweep paced at idempotency.cleanup_keys_per_second = $PACE in part 3, unpaced (0) in part 1; bench/cleanup/claim.pgbench (BEGIN; idem_claim of a new key; idem_complete; COMMIT), p99 from --log; 3a/3a'/3c over the whole run but its first second, 3b over the transactions overlapping the sweep; each value the median of $REPS repetitions (in each, the no-cleanup run and the run with cleanup share the data, odd repetitions without cleanup first, even ones with it first); the pooled ratio takes p99 over the claims of all repetitions at once"
    echo
    report
    echo
    echo "Notes: 3c's p99 is over a ${PGB_SECONDS}-s run of which the drop disturbs well under a second, so a longer run"
    echo "dilutes it; the slowest claim overlapping the drop does not depend on the run length. Claims and the"
    echo "cleanup share the machine's $(nproc) CPUs with pgbench itself."
    echo
    echo "## Per repetition"
    echo
    per_repetition
    echo
    echo "Raw pgbench logs and the server log: raw/."
} > "$WORK/results.md"

echo
report | sed -e 's/^| //' -e 's/ |$//' | column -t -s '|'
echo
echo "results: $OUT/results.csv and $OUT/results.md"
