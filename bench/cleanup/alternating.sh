#!/usr/bin/env bash
# Claim p99 with and without the worker's paced sweep, in alternating windows of one run:
#   bench/cleanup/alternating.sh
# One fixed-rate claim load (pgbench -R) runs for the whole measurement while a single sweep of
# many expired keys is released (idempotency.cleanup_keys_per_second = CLEANUP_BENCH_PACE) and held
# (1 key/s: one batch of 200 would take 200 s) by reloads, in windows of CLEANUP_ALT_WINDOW seconds,
# CLEANUP_ALT_CYCLES cycles of one window each way, the order alternating (on off, off on, ...).
# Drift on the machine (its disk, its neighbours) then falls on both sides alike, and the whole run
# is measurement, with no reload of data between the two sides. Claims are counted from their
# scheduled start; the first CLEANUP_ALT_GUARD seconds of each window are left out (the reload
# reaching the sweeper). Reported per client count (CLEANUP_BENCH_CLIENTS, '1 2'): p99 over all
# claims of each side (pooled), the median of the per-cycle ratios, the keys removed per second of
# sweep against the keys the claims created, and the WAL per second on each side (so the windows
# are shown to be what they claim), and the disk's own latency per side (ms per write completed,
# from /proc/diskstats: a slow spell of the disk shows whichever side it falls on, in raw/disk).
# Other knobs: CLEANUP_BENCH_RATE (150 claims/s over all clients), CLEANUP_BENCH_BATCH
# (200), CLEANUP_BENCH_PORT (5578), CLEANUP_BENCH_DIR (/tmp/cleanalt_helper; its data/ and work/
# are deleted), CLEANUP_BENCH_OUT (bench/out/cleanup_alternating). Needs the extension installed
# (make install); as root.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
WINDOW=${CLEANUP_ALT_WINDOW:-10}
CYCLES=${CLEANUP_ALT_CYCLES:-30}
GUARD=${CLEANUP_ALT_GUARD:-1}
PORT=${CLEANUP_BENCH_PORT:-5578}
DIR=${CLEANUP_BENCH_DIR:-/tmp/cleanalt_helper}
OUT=${CLEANUP_BENCH_OUT:-$HERE/../out/cleanup_alternating}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
RATE=${CLEANUP_BENCH_RATE:-150}
CLIENTS=${CLEANUP_BENCH_CLIENTS:-1 2}
PACE=${CLEANUP_BENCH_PACE:-2000}
BATCH=${CLEANUP_BENCH_BATCH:-200}
HELD_PACE=1
DB=cleanbench
COMMAND="$(env | grep -o '^CLEANUP_\(BENCH\|ALT\)_[A-Z_]*=.*' | sort | tr '\n' ' ' || true)bench/cleanup/alternating.sh"
# Enough expired keys that the sweep never runs out: every "on" second at the pace, and a margin.
EXPIRED=$((PACE * CYCLES * WINDOW * 12 / 10 + 10000))
LIVE=100000

source "$HERE/lib.sh"
start_work

start_bench_cluster
# The disk under the cluster, sampled twice a second (/proc/diskstats: writes completed, ms spent writing), so that
# each side's storage latency is on record: slow spells of the disk itself show on both sides alike.
DISK=$(basename "$(df --output=source "$DIR" | tail -1)")
( while :; do awk -v t="$(now_epoch)" -v d="$DISK" '$3 == d { print t, $8, $11 }' /proc/diskstats; sleep 0.5; done ) > "$RAW/disk" &
BG_PIDS+=($!)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
SO=$("$PGBIN/pg_config" --pkglibdir)/idempotency.so
VERSION="installed idempotency.so md5 $(md5sum < "$SO" | cut -c1-12), repo HEAD $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown) with $( (git -C "$HERE" status --porcelain -- ../../src ../../sql 2>/dev/null || true) | wc -l) uncommitted change(s) under src/ and sql/"
say "seed: $EXPIRED expired + $LIVE live keys"
psql_q -v expired="$EXPIRED" -v live="$LIVE" -f "$HERE/make_seed.sql"

sleep_until() { local d; d=$(calc "$1 - $(now_epoch)" 3); awk "BEGIN {exit !($d > 0)}" && sleep "$d" || true; }
expired_left() { val "SELECT count(*) FROM public.idempotency_keys WHERE expires_at <= now()"; }

# Latencies (ms) of the claims of log <name> scheduled in [from, to] (epoch s), one per line.
claims_in() {
    cat "$RAW/$1".[0-9]* | awk -v ws="$2" -v we="$3" '
        { start = $5 + $6 / 1e6 - $3 / 1e6; if (start >= ws && start < we) print $3 / 1000 }'
}
# Disk writes completed and ms spent writing between two epochs: "writes ms".
disk_writes_in() {
    awk -v ws="$1" -v we="$2" '$1 >= ws && !f { w0 = $2; m0 = $3; f = 1 } $1 <= we { w1 = $2; m1 = $3 }
        END { printf "%d %d\n", w1 - w0, m1 - m0 }' "$RAW/disk"
}
# n p50 p99 of the latencies in a file.
stats_of() {
    sort -g "$1" | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "0 0 0"; exit }
        i50 = int(NR * 0.50); if (i50 < NR * 0.50) i50++;
        i99 = int(NR * 0.99); if (i99 < NR * 0.99) i99++;
        printf "%d %.3f %.3f\n", NR, v[i50], v[i99] }'
}

TOTAL=$((CYCLES * 2 * WINDOW))
ROWS=
for clients in $CLIENTS; do
    name=alt_c$clients
    windows=$RAW/windows_c$clients
    : > "$windows"
    set_reload idempotency.cleanup_keys_per_second "$HELD_PACE"
    say "$clients client(s): load $EXPIRED expired + $LIVE live keys"
    psql_q -f "$HERE/load_keys.sql"
    before=$(expired_left)
    say "$clients client(s): $RATE claims/s for $((TOTAL + 8)) s; $CYCLES cycles of ${WINDOW}-s windows with and without the sweep"
    start_pgbench "$name" $((TOTAL + 8)) "$clients"
    t0=$(now_epoch)
    # One sweep, started held: its first batch goes, then it waits for a reload.
    set_interval 1s
    for i in $(seq 1 500); do [ "$(sweeper_running)" = 1 ] && break; sleep 0.02; done
    set_interval 1h
    [ "$(sweeper_running)" = 1 ] || { echo "the sweep did not start" >&2; exit 1; }
    start=$(calc "$t0 + 5" 6)
    for cycle in $(seq 1 "$CYCLES"); do
        for condition in $([ $((cycle % 2)) = 1 ] && echo "on off" || echo "off on"); do
            sleep_until "$start"
            lsn0=$(val "SELECT pg_current_wal_lsn()")
            set_reload idempotency.cleanup_keys_per_second "$([ "$condition" = on ] && echo "$PACE" || echo "$HELD_PACE")"
            end=$(calc "$start + $WINDOW" 6)
            sleep_until "$end"
            lsn1=$(val "SELECT pg_current_wal_lsn()")
            echo "$cycle $condition $start $end $(val "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")" >> "$windows"
            start=$end
        done
    done
    set_reload idempotency.cleanup_keys_per_second "$HELD_PACE"
    wait_pgbench
    left=$(expired_left)
    [ "$(sweeper_running)" = 1 ] && [ "$left" -gt 0 ] || { echo "the sweep ran out of expired keys before the end" >&2; exit 1; }
    # Let the rest go unpaced, so the next client count starts with no sweep under way.
    set_reload idempotency.cleanup_keys_per_second 0
    for i in $(seq 1 3000); do [ "$(sweeper_running)" = 0 ] && break; sleep 0.1; done

    : > "$RAW/pooled_on_c$clients"; : > "$RAW/pooled_off_c$clients"
    ratios= on_wal=0 off_wal=0
    declare -A DISK_WRITES=([on]=0 [off]=0) DISK_MS=([on]=0 [off]=0)
    for cycle in $(seq 1 "$CYCLES"); do
        declare -A P99=()
        while read -r c condition ws we wal; do
            [ "$c" = "$cycle" ] || continue
            claims_in "$name" "$(calc "$ws + $GUARD" 6)" "$we" > "$RAW/window"
            cat "$RAW/window" >> "$RAW/pooled_${condition}_c$clients"
            set -- $(stats_of "$RAW/window")
            P99[$condition]=$3
            csv 3 p99_ms "${condition}_c$clients" "$cycle" "$3" ms
            csv 3 wal_bytes_per_second "${condition}_c$clients" "$cycle" "$(calc "$wal / $WINDOW" 0)" B/s
            set -- $(disk_writes_in "$(calc "$ws + $GUARD" 6)" "$we")
            DISK_WRITES[$condition]=$((DISK_WRITES[$condition] + $1)); DISK_MS[$condition]=$((DISK_MS[$condition] + $2))
            csv 3 disk_ms_per_write "${condition}_c$clients" "$cycle" "$(calc "$2 / ($1 + ($1 == 0))" 3)" ms
            [ "$condition" = on ] && on_wal=$((on_wal + wal)) || off_wal=$((off_wal + wal))
        done < "$windows"
        ratio=$(calc "${P99[on]} / ${P99[off]}" 3)
        ratios+="$ratio "
        csv 3 p99_ratio "on/off_c$clients" "$cycle" "$ratio" x
    done
    set -- $(stats_of "$RAW/pooled_on_c$clients"); n_on=$1 p50_on=$2 p99_on=$3
    set -- $(stats_of "$RAW/pooled_off_c$clients"); n_off=$1 p50_off=$2 p99_off=$3
    pooled=$(calc "$p99_on / $p99_off" 3)
    paired=$(echo "$ratios" | median)
    on_seconds=$((CYCLES * WINDOW))
    removal=$(calc "($before - $left) / $on_seconds" 0)
    creation=$(calc "$n_on / ($on_seconds - $CYCLES * $GUARD)" 1)
    removal_ratio=$(calc "$removal / $creation" 1)
    csv 3 p99_ratio "on/off_c$clients" pooled "$pooled" x "<=1.2" "$(pass "$pooled <= 1.2")"
    csv 3 p99_ratio "on/off_c$clients" median "$paired" x "<=1.2" "$(pass "$paired <= 1.2")"
    csv 3 removal_to_creation_ratio "on_c$clients" all "$removal_ratio" x ">=10" "$(pass "$removal_ratio >= 10")"
    say "  pooled p99 $p99_on ms with the sweep, $p99_off ms without (${pooled}x); paired median ${paired}x; removal $removal keys/s = ${removal_ratio}x creation"
    ROWS+="| $clients | $p99_off / $p50_off ms ($n_off) | $p99_on / $p50_on ms ($n_on) | **${pooled}x** $(pass "$pooled <= 1.2") | ${paired}x $(pass "$paired <= 1.2") ($(echo "$ratios" | tr ' ' '\n' | grep -v '^$' | sort -g | sed -n '1p;$p' | paste -sd' ' - | sed 's/ / to /') over $CYCLES cycles) | $removal keys/s, **${removal_ratio}x** $(pass "$removal_ratio >= 10") | $(calc "$off_wal / $on_seconds / 1024" 0) / $(calc "$on_wal / $on_seconds / 1024" 0) KiB/s | $(calc "${DISK_MS[off]} / (${DISK_WRITES[off]} + 1e-9)" 3) / $(calc "${DISK_MS[on]} / (${DISK_WRITES[on]} + 1e-9)" 3) ms ($(calc "${DISK_WRITES[off]} / $on_seconds" 0) / $(calc "${DISK_WRITES[on]} / $on_seconds" 0) writes/s) |
"
done

LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
{
    echo "# Claim p99 with and without the paced sweep, alternating windows"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, Linux $(uname -r); load average $LOAD_START at start, $LOAD_END at end"
    echo "- server: $(val 'SHOW server_version'), shared_buffers 512MB, synchronous_commit on, autovacuum off, checkpoint_timeout 1h"
    echo "- command: \`$COMMAND\`"
    echo "- extension: $VERSION"
    echo "- load: pgbench -M prepared -R $RATE (claims/s over all clients), bench/cleanup/claim.pgbench; $EXPIRED expired + $LIVE live keys loaded, vacuumed and checkpointed once per client count"
    echo "- sweep: one sweep, released at $PACE keys/s and held at $HELD_PACE key/s by reloads; batches of $BATCH; $CYCLES cycles of ${WINDOW}-s windows each way (order alternating), the first ${GUARD} s of each window left out"
    echo
    echo "| clients | p99 / p50 without (claims) | p99 / p50 with the sweep (claims) | p99 ratio, pooled (target <= 1.2x) | p99 ratio, median of the per-cycle ratios (range) | removal / creation (target >= 10x) | WAL/s without / with | disk ms per write without / with |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s' "$ROWS"
    echo
    echo "Per window: results.csv; raw pgbench logs, the windows and the server log: raw/."
} > "$WORK/results.md"
cat "$WORK/results.md"
