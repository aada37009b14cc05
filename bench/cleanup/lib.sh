# Helpers shared by the expiry benchmarks (run.sh, alternating.sh): psql on the benchmark
# cluster, small arithmetic, the cluster itself, and pgbench at a fixed rate with per-transaction
# logs. The caller sets PGBIN, DIR, OUT, PORT, DB, HERE, BATCH and RATE first, then calls start_work. Run as root.

psql_q() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR" -p "$PORT" -U postgres -d "$DB" "$@"; }
val() { psql_q -Atc "$1"; }
say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
csv() { echo "$1,$2,$3,$4,$5,$6,${7:-},${8:-}" >> "$CSV"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
calc() { awk "BEGIN {printf \"%.${2:-3}f\", $1}"; }
pass() { awk "BEGIN {print ($1) ? \"yes\" : \"NO\"}"; }

# The cluster is scripts/lib/cluster.sh's, in $DIR/data with its log in $DIR/server.log.
PG_BIN=${PGBIN:-/usr/lib/postgresql/15/bin}
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/cluster.sh"

# The run's files are written under $DIR/work and copied to $OUT when the script exits (bench/out/ is shared):
# checks $DIR, empties $DIR/work, starts results.csv, and sets the exit trap that publishes.
start_work() {
    case "$DIR" in /tmp/?*) ;; *) echo "CLEANUP_BENCH_DIR must be under /tmp (its data/ is deleted)" >&2; exit 2 ;; esac
    OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
    WORK=$DIR/work
    RAW=$WORK/raw
    rm -rf "$WORK"
    mkdir -p "$RAW"
    CSV=$WORK/results.csv
    echo "part,measure,variant,rep,value,unit,target,pass" > "$CSV"
    trap publish EXIT
}
# BG_PIDS: background samplers a benchmark started, stopped here too.
BG_PIDS=()
publish() {
    local pid
    for pid in "${BG_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    stop_bench
    [ -f "$DIR/server.log" ] && cp "$DIR/server.log" "$RAW/server.log"
    rm -rf "$DIR/data" "$OUT/raw"
    mkdir -p "$OUT"
    cp -r "$WORK"/* "$OUT"/
}

PGB_PID=
# Stops pgbench and the server; $DIR stays (it holds the run's results).
stop_bench() {
    if [ -n "$PGB_PID" ] && kill -0 "$PGB_PID" 2>/dev/null; then kill "$PGB_PID"; fi
    if [ -f "$DIR/data/postmaster.pid" ]; then cluster_ctl "$DIR" stop -m fast || true; fi
}
# ALTER SYSTEM and a reload: <setting> <value>.
set_reload() {
    val "ALTER SYSTEM SET $1 = '$2'" >/dev/null
    val "SELECT pg_reload_conf()" >/dev/null
}
set_interval() { set_reload idempotency.cleanup_interval "$1"; }
sweeper_running() { val "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup'"; }
last_sweep() { val "SELECT coalesce(last_sweep_started_at::text, '-') FROM public.idem_stats"; }

# A throwaway cluster in $DIR/data with database $DB, the extension and pg_walinspect; the sweep
# runs only when a benchmark starts one (cleanup_interval 1h), in batches of $BATCH. Checkpoints
# only where a benchmark asks for them; no autovacuum writing WAL during a measurement.
start_bench_cluster() {
    stop_bench
    rm -rf "$DIR/data" "$DIR/server.log"
    init_cluster "$DIR" "$PORT" "fsync = on" "listen_addresses = ''" \
        "shared_preload_libraries = 'idempotency'" "idempotency.databases = '$DB'" \
        "idempotency.cleanup_interval = '1h'" "idempotency.cleanup_keys_per_second = 0" \
        "idempotency.cleanup_batch_size = $BATCH" "shared_buffers = 512MB" "checkpoint_timeout = 1h" \
        "max_wal_size = 16GB" "autovacuum = off" "lc_messages = 'C'"
    cluster_ctl "$DIR" start
    "$PGBIN/psql" -X -q -h "$DIR" -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE $DB"
    psql_q -c "CREATE EXTENSION idempotency" -c "CREATE EXTENSION pg_walinspect"
}

# Starts pgbench in the background: <name> <seconds> [clients], prepared, at $RATE claims/s in
# all (unless 0), per-transaction log <name>.*.
PGB_H=$(printf 'ab%.0s' $(seq 32))
PGB_BODY='{"id": "pay_1", "object": "payment", "amount": 1250, "currency": "eur", "status": "succeeded"}'
start_pgbench() {
    rm -f "$RAW/$1".*
    local c=${3:-2}
    (cd "$RAW" && exec "$PGBIN/pgbench" -n -M prepared -c "$c" -j "$c" -T "$2" $([ "$RATE" = 0 ] || echo "-R $RATE") \
        -f "$HERE/claim.pgbench" \
        -D "h=$PGB_H" -D "body=$PGB_BODY" --log --log-prefix="$1" \
        -h "$DIR" -p "$PORT" -U postgres "$DB" > "$RAW/$1.out" 2>&1) &
    PGB_PID=$!
}
wait_pgbench() { wait "$PGB_PID"; PGB_PID=; }

# Latency of the transactions of log <name> that overlap [from, to] (epoch s): n p50_ms p99_ms max_ms tps.
# With a fourth argument, their latencies are appended to that file too (for the pooled p99).
latency() {
    cat "$RAW/$1".[0-9]* | awk -v ws="$2" -v we="$3" '
        { end = $5 + $6 / 1e6; start = end - $3 / 1e6;
          if (end >= ws && start <= we) print $3 / 1000 }' | tee -a "${4:-/dev/null}" | sort -g |
    awk -v ws="$2" -v we="$3" '{ v[NR] = $1 } END {
        if (NR == 0) { print "0 0 0 0 0"; exit }
        i50 = int(NR * 0.50); if (i50 < NR * 0.50) i50++;
        i99 = int(NR * 0.99); if (i99 < NR * 0.99) i99++;
        printf "%d %.3f %.3f %.3f %.1f\n", NR, v[i50], v[i99], v[NR], NR / (we - ws) }'
}
# p99 (ms) of the latencies in a file, one per line.
p99_of() { sort -g "$1" | awk '{ v[NR] = $1 } END { i = int(NR * 0.99); if (i < NR * 0.99) i++; printf "%.3f", NR ? v[i] : 0 }'; }
now_epoch() { date +%s.%N; }
pgbench_end() { cat "$RAW/$1".[0-9]* | awk '{ e = $5 + $6 / 1e6; if (e > m) m = e } END { printf "%.6f", m }'; }
