#!/usr/bin/env bash
# Runs pg_regress, the isolation specs, a cleanup-worker pass and random_args.sql against a postmaster under
# valgrind memcheck (backends and background workers are forked children, so each one is checked), and counts
# memcheck errors whose stack is in idempotency.so vs elsewhere. Not part of scripts/test.sh: ~5 min on 2 CPUs.
#   as root, after `make install`:  test/robustness/valgrind.sh        (see README.md here)
# Env: VG_PORT (5588), VG_DIR (work dir, kept; default a new /tmp/idem-valgrind.XXXXXX, kept only on failure).
# Ends with "valgrind: N processes, N invalid reads/writes in idempotency"; exit 0 only when no memcheck error
# of any kind is in idempotency.so, none is left elsewhere, no process crashed, the worker did its work and
# random_args.sql found nothing.
# Caveat: a stock server does not tell memcheck about palloc chunks, so an overrun that stays inside a memory
# context block is not seen; the C++ core (new/malloc) and reads of never-written memory are.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/test/robustness
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
port=${VG_PORT:-5588}
dir=${VG_DIR:-$(mktemp -d /tmp/idem-valgrind.XXXXXX)}
module=$(pg_config --pkglibdir)/idempotency.so
cmp -s "$module" "$root/idempotency.so" 2>/dev/null ||
    echo "warning: $module differs from $root/idempotency.so; run make install first to check this tree"

mkdir -p "$dir/vg" && chown -R postgres "$dir"
cp "$module" "$dir/loaded.so"    # what the server runs, in case make install replaces it meanwhile
source "$root/scripts/lib/cluster.sh"
# The cluster as every test makes it, but started under valgrind rather than by pg_ctl.
init_cluster "$dir" "$port" "listen_addresses = ''" "max_prepared_transactions = 10" \
    "shared_preload_libraries = 'idempotency'" || exit 1
# --error-exitcode makes a process with an error exit 128, which the postmaster treats as a crash: errors
# also show up as failed tests and in server.log, not only in the logs counted below.
su postgres -c "valgrind --trace-children=yes --leak-check=no --track-origins=no --num-callers=40 \
    --error-exitcode=128 --suppressions='$here/postgresql15.supp' --log-file='$dir/vg/vg.%p.log' \
    $PG_BIN/postgres -D '$dir/data' >'$dir/server.log' 2>&1 &"
stop() { cluster_ctl "$dir" stop -m fast -t 300 2>/dev/null; }
trap stop EXIT
export PGHOST=$dir PGPORT=$port PGUSER=postgres
# Also after a crash restart (crash recovery under valgrind takes a while), so one crash fails few tests.
wait_ready() { for _ in $(seq 300); do "$PG_BIN/pg_isready" -q && return; sleep 1; done; }
wait_ready
start=$SECONDS

# Results go to $dir, not into the source tree other runs may be using.
make -s -C "$root" installcheck ISOLATION= EXTRA_REGRESS_OPTS="--outputdir=$dir/regress" >"$dir/regress.log" 2>&1
wait_ready
make -s -C "$root" installcheck REGRESS= EXTRA_REGRESS_OPTS="--outputdir=$dir/isolation" >"$dir/isolation.log" 2>&1
wait_ready
grep -Eh 'tests (passed|failed)' "$dir/regress.log" "$dir/isolation.log" | sed 's/^ *//'

# The suites never run the background cleanup worker. Give it work in both storage modes: expired rows to
# delete in table mode, then an expired partition to drop in partitioned mode.
psql -qX -d postgres -v ON_ERROR_STOP=1 >"$dir/worker.log" 2>&1 <<'EOF' && setup=ok || setup=failed
CREATE DATABASE vg_worker;
\c vg_worker
CREATE EXTENSION idempotency;
CREATE FUNCTION put(n int, ttl interval) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        PERFORM idem_claim('k' || i || ttl, idem_hash(i::text), ttl);
        PERFORM idem_complete('k' || i || ttl, 201, jsonb_build_object('i', i), '{"h": "v"}');
    END LOOP;
END $$;
SELECT put(50, '1 millisecond'), put(20, '1 hour');
SELECT idem_stats_reset();
ALTER SYSTEM SET idempotency.databases = 'postgres,vg_worker';
ALTER SYSTEM SET idempotency.cleanup_interval = 1;
SELECT pg_reload_conf();
EOF
# wait_for SQL: until SQL (on vg_worker) answers t, at most 2 minutes (a sweep takes ~10 s under valgrind).
wait_for() {
    [ "$setup" = ok ] || return 1
    for _ in $(seq 120); do
        [ "$(psql -qXtA -d vg_worker -c "$1" 2>>"$dir/worker.log")" = t ] && return 0
        sleep 1
    done
    return 1
}
wait_for "SELECT keys_removed >= 50 FROM idem_stats" && swept=yes || swept=no
# A partition whose range has passed, holding one row (written directly: a claim cannot expire in the past).
psql -qX -d vg_worker -v ON_ERROR_STOP=1 >>"$dir/worker.log" 2>&1 <<'EOF' || setup=failed
SELECT idem_set_storage('partitioned', partition_interval => interval '1 hour');
SELECT idem_create_partition(date_bin('1 hour', now(), '2000-01-01') - interval '3 hours',
                             date_bin('1 hour', now(), '2000-01-01') - interval '2 hours');
INSERT INTO idempotency_keys_partitioned
SELECT now() - interval '150 minutes', now() - interval '1 day', 201, '', 'old', sha256('old'), NULL, '{}';
SELECT idem_stats_reset(), put(10, '1 millisecond');
EOF
wait_for "SELECT partitions_dropped >= 1 FROM idem_stats" && dropped=yes || dropped=no
psql -qX -d vg_worker -c "SELECT idem_cleanup(), idem_drop_expired_partitions(), idem_set_storage('table')" \
    >>"$dir/worker.log" 2>&1
echo "cleanup worker: deleted expired keys: $swept, dropped an expired partition: $dropped"
# Edge-case arguments to every idem_* function, while the worker keeps sweeping (see random_args.sql).
psql -qX -d vg_worker -v ON_ERROR_STOP=1 -v seed=0.42 -v calls=3000 -f "$here/random_args.sql" \
    >"$dir/random_args.out" 2>&1
args=$(grep -Eo 'random arguments: [0-9]+ calls, .*claim' "$dir/random_args.out")
echo "${args:-random arguments: did not finish}"
stop
trap - EXIT
echo "time under valgrind: $((SECONDS - start)) s"
crashes=$(grep -Ec 'terminated by signal|exited with exit code 128' "$dir/server.log")

perl "$here/vg_summary.pl" "$module" "$dir/loaded.so" "$dir"/vg/vg.*.log >"$dir/summary.txt"
eval "$(tail -1 "$dir/summary.txt")"    # processes= ours_rw= ours_uninit= ours_other= else_rw= else_uninit= ...
ours=$((ours_rw + ours_uninit + ours_other))
others=$((else_rw + else_uninit + else_other))
[ "$ours" -gt 0 ] && head -n -1 "$dir/summary.txt"
[ "$others" -gt 0 ] && grep -l 'ERROR SUMMARY: [1-9]' "$dir"/vg/vg.*.log | sed 's/^/error outside idempotency.so: /'
echo "uninitialised-value errors in idempotency: $ours_uninit, other errors in idempotency: $ours_other"
echo "elsewhere: $else_rw invalid reads/writes, $else_uninit uninitialised, $else_other other; server crashes: $crashes"
echo "valgrind: $processes processes, $ours_rw invalid reads/writes in idempotency"

# Suite failures are reported, not fatal: some specs depend on timing, which valgrind slows 20-50 times.
status=0
[ "$ours" -eq 0 ] && [ "$others" -eq 0 ] && [ "$crashes" -eq 0 ] &&
    [ "$swept" = yes ] && [ "$dropped" = yes ] && [[ $args == *", 0 internal errors, 0 calls lost"* ]] || status=1
if [ "$status" -eq 0 ] && [ -z "${VG_DIR:-}" ]; then rm -rf "$dir"; else echo "logs: $dir"; fi
exit "$status"
