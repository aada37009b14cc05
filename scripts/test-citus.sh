#!/usr/bin/env bash
# The extension on a Citus cluster: builds PostgreSQL 17 (scripts/build-pg.sh) with Citus 14.0.1
# (scripts/build-citus.sh) and the extension into it, then runs the Citus suites of the test tree,
# test/citus/NNN_<suite>.pl: Perl TAP tests, each on a cluster of its own, a coordinator and two workers on loopback
# (IdemNode->citus_cluster in test/perl/IdemNode.pm), run as user postgres. Run as root. Prints one line per
# suite, "<suite> N passed, N failed" (one per TAP assertion), then the total "N passed, N failed":
#   citus-build      the builds (extension with zero warnings)
#   citus-layout     each unsupported layout refused with its message, then idem_citus_distribute; then
#                    idempotency.tombstone_ttl > 0 refused (SET, claims, idem_cleanup(), the sweeper)
#   citus-semantics  new key, replay, mismatch, in_progress, rollback, 5xx, scopes, lease takeover, a delegated
#                    post_payment, from every node; a call that was not delegated is refused
#   citus-ops        the sweeper on every node, idem_citus_stats() on the coordinator
#   citus-load       8 clients over the three nodes, 2,000 payments with retries, a worker killed (-9) and restarted
#   citus-move       a claim held while its shard moves (the move waits for it, its row moves); 8 clients paying
#                    to busy tenants with retries while their shards move between the workers (block_writes and
#                    force_logical); a lease's fencing numbers keep increasing across the moves
#   citus-lease      a lease's heartbeats, checkpoint, completion and release through every node and across shard
#                    moves; the direct path's shard metadata lock is the one Citus's router writes take
# Without the Citus tarball (scripts/build-citus.sh) it prints "citus SKIPPED: <reason>" and exits 3.
# IDEM_PG_ROOT overrides /opt/idem-pg (as for the builds); IDEM_CITUS_SUITES (a pattern, default [0-9]*) picks
# suites; IDEM_CITUS_LOAD_KEYS (2000), IDEM_CITUS_MOVE_KEYS (600) and IDEM_CITUS_LOAD_CLIENTS (8) size the loads.
set -uo pipefail
cd "$(dirname "$0")/.."
prefix=${IDEM_PG_ROOT:-/opt/idem-pg}/17
PG_BIN=$prefix/bin
source scripts/lib/cluster.sh

log_dir=$(mktemp -d /tmp/idem-citus-logs.XXXXXX)
chmod 755 "$log_dir"
COUNT_FORMAT='%s %d passed, %d failed\n'
source scripts/lib/count.sh

work=$(mktemp -d /tmp/idem-citus.XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work" "$log_dir"' EXIT

finish() {
    echo
    cat "$log_dir/summary" 2>/dev/null
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit $?
}

# ---------- builds ----------
# Builds PostgreSQL 17 too when it is missing, after finding the tarball.
scripts/build-citus.sh >"$log_dir/build-citus.log" 2>&1
status=$?
cat "$log_dir/build-citus.log"
if [ "$status" -eq 3 ]; then
    echo "citus SKIPPED: $(grep -o 'no Citus source tarball.*' "$log_dir/build-citus.log")"
    exit 3
fi
[ "$status" -eq 0 ] || { count citus-build 0 1; finish; }
mkdir -p "$work/src"
copy_source_tree "$work/src"
if ! nice -n 10 make -C "$work/src" -j2 PG_CONFIG="$PG_BIN/pg_config" >"$log_dir/make.log" 2>&1 ||
   ! make -C "$work/src" -s PG_CONFIG="$PG_BIN/pg_config" install >>"$log_dir/make.log" 2>&1; then
    cat "$log_dir/make.log"
    count citus-build 0 1
    finish
fi
if grep -q 'warning:' "$log_dir/make.log"; then
    grep -A3 'warning:' "$log_dir/make.log"
    count citus-build 1 1
else
    count citus-build 2 0
fi

# ---------- the suites ----------
# From the copy, where user postgres may write (PostgreSQL::Test::Cluster keeps its nodes in tmp_check/).
chown -R postgres "$work/src"
tap_perl=$("$PG_BIN/pg_config" --pkglibdir)/pgxs/src/test/perl
for test in "$work"/src/test/citus/${IDEM_CITUS_SUITES:-[0-9]*}.pl; do
    name=$(basename "$test" .pl)
    suite=citus-${name#*_}
    (cd "$work/src" && su postgres -c "$(printf '%q ' env PATH="$PG_BIN:$PATH" \
        IDEM_CITUS_LOAD_KEYS="${IDEM_CITUS_LOAD_KEYS:-2000}" IDEM_CITUS_MOVE_KEYS="${IDEM_CITUS_MOVE_KEYS:-600}" \
        IDEM_CITUS_LOAD_CLIENTS="${IDEM_CITUS_LOAD_CLIENTS:-8}" \
        perl -I "$tap_perl" -I test/perl "test/citus/$name.pl")") >"$log_dir/$suite.log" 2>&1
    status=$?
    cat "$log_dir/$suite.log"
    # A failing suite's nodes' logs, for the reader of this output.
    [ "$status" -ne 0 ] && tail -n 30 "$work"/src/log/*"$name"*.log 2>/dev/null
    count_tap "$suite" "$log_dir/$suite.log" "$status"
    # Not in the "<suite> N passed, N failed" form: scripts/test.sh counts those lines, and the summary at the
    # end prints each suite once.
    echo "== $(tail -n 1 "$log_dir/summary")"
done

finish
