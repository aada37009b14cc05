#!/usr/bin/env bash
# Runs every test suite against a real, throwaway PostgreSQL 15 cluster, as CI does:
#   C++ unit tests (plain and under ASan/UBSan), the libFuzzer run, pg_regress (also in partitioned storage),
#   isolation specs, pgTAP (pg_prove), the Perl TAP tests (as user postgres; the fault and load tests also in
#   partitioned storage), sqlsmith, the managed edition, the release artifacts (the Debian package, the
#   PGXN zip, the Prometheus queries and alerts, the clients' packages), and the Go, Node.js and Python clients.
# Ends with one line over all suites: "N passed, N failed". Exit status 0 only when nothing failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/cluster.sh

started=$(date +%s)
scripts/install-deps.sh
make -s >/dev/null && make -s install >/dev/null || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
log_dir=$(mktemp -d /tmp/idem-test-logs.XXXXXX)
chmod 755 "$log_dir"
printf '%-10s %5ds\n' build $(( $(date +%s) - started )) >"$log_dir/times"

# count, judge, run_single, run_gtest_suite, count_regress, count_tap, run_counted_suites: shared with
# scripts/test-versions.sh. A suite fails on a non-zero exit status whatever its output says.
source scripts/lib/count.sh

# timed STAGE COMMAND...: runs COMMAND in this shell (the counts add up) and notes the stage's wall time.
timed() {
    local stage=$1 t0
    shift
    t0=$(date +%s)
    "$@"
    printf '%-10s %5ds\n' "$stage" $(( $(date +%s) - t0 )) >>"$log_dir/times"
}

timed packaging run_single packaging make -s versioncheck
timed unit run_gtest_suite unit make -s -C test/unit run
timed fuzz run_single fuzz make -s -C test/fuzz run

cluster=$(mktemp -d /tmp/idem-test-cluster.XXXXXX)
trap 'stop_cluster "$cluster"; rm -rf "$log_dir"' EXIT
start_cluster "$cluster" 55432 "shared_preload_libraries = 'idempotency'" "max_prepared_transactions = 10" ||
    count cluster 0 1
export PGHOST=$cluster PGPORT=55432 PGUSER=postgres

regress() {
    make -s installcheck ISOLATION= 2>&1 | tee "$log_dir/regress.log"
    count_regress regress "$log_dir/regress.log" "${PIPESTATUS[0]}"
    [ -f regression.diffs ] && cat regression.diffs
}
timed regress regress

# pg_regress again with the database's storage partitioned before each file (issue 39), in 1-day and in 1-hour
# partitions: the files read the partitioned table where they name the key table; the few whose output shows the
# storage have their own expected file, and those that are about one storage or walk both themselves are skipped,
# each with its reason (scripts/test-regress-partitioned.sh, test/regress-partitioned/; about 5 s).
timed regress-p run_counted_suites regress-partitioned scripts/test-regress-partitioned.sh

isolation() {
    make -s installcheck REGRESS= 2>&1 | tee "$log_dir/isolation.log"
    count_regress isolation "$log_dir/isolation.log" "${PIPESTATUS[0]}"
    [ -f output_iso/regression.diffs ] && cat output_iso/regression.diffs
}
timed isolation isolation

pgtap() {
    psql -qX -d postgres -c "DROP DATABASE IF EXISTS pgtap_tests" -c "CREATE DATABASE pgtap_tests"
    psql -qX -d pgtap_tests -c "CREATE EXTENSION idempotency"
    pg_prove -v -d pgtap_tests test/pgtap/*.sql 2>&1 | tee "$log_dir/pgtap.log"
    count_tap pgtap "$log_dir/pgtap.log" "${PIPESTATUS[0]}"
}
timed pgtap pgtap

# The Perl TAP tests (test/tap, module test/perl/IdemNode.pm). PostgreSQL::Test::Cluster refuses to run as root;
# it makes its own clusters. They run from a copy: the clone may sit below a directory that user postgres cannot
# enter. IDEM_TAP_TESTS picks the tests (default every test/tap/*.pl).
# tap SUITE TESTS [STORAGE]: STORAGE partitioned switches the database of IdemNode->create to partitioned storage.
tap() {
    local suite=$1 tests=$2 storage=${3:-table} tap_dir
    tap_dir=$(mktemp -d /tmp/idem-tap.XXXXXX)
    mkdir -p "$tap_dir/test"
    cp Makefile idempotency.control "$tap_dir/"
    cp -r test/tap test/perl "$tap_dir/test/"
    chown -R postgres "$tap_dir"
    su postgres -c "cd '$tap_dir' && IDEM_TAP_STORAGE=$storage make -s prove_installcheck PROVE_TESTS='$tests'" 2>&1 \
        | tee "$log_dir/$suite.log"
    count_tap "$suite" "$log_dir/$suite.log" "${PIPESTATUS[0]}"
    rm -rf "$tap_dir"
}
timed tap tap tap "${IDEM_TAP_TESTS:-test/tap/*.pl}"

# The fault and load tests again with their database in partitioned storage (issue 39): IdemNode->create switches
# it when IDEM_TAP_STORAGE=partitioned, and they read the stored rows from $node->key_table (about 65 s). The
# other TAP files that store keys walk both storage modes themselves, or are about one of them.
timed tap-p tap tap-partitioned \
    'test/tap/100_crash_retry.pl test/tap/110_ambiguous_commit.pl test/tap/120_vanished_client.pl test/tap/130_pgbench_load.pl' \
    partitioned

# Random SQL (sqlsmith, seed 42) and random idem_* arguments on a throwaway cluster of its own: no backend
# may crash (~20 s). test/robustness/valgrind.sh (~5 min) stays a separate command.
timed sqlsmith run_single sqlsmith env SMITH_PORT=55433 test/robustness/sqlsmith.sh

# Release (issue 31), as DBAs and developers install it: the Debian package built with pg_buildext and lintian,
# installed with apt-get into the system's PostgreSQL 15, pg_regress and the isolation specs against it, purged
# (scripts/test-package.sh; the files of the build stage's `make install` are moved aside meanwhile and put back);
# the PGXN zip validated and installed with `pgxn install` into a throwaway copy of PostgreSQL 15, and a smoke test
# (scripts/test-pgxn.sh); the alerting rules (promtool) and postgres_exporter with contrib/prometheus/queries.yaml
# scraped for every idem_ series (contrib/prometheus/test.sh); the clients' packages built and checked
# (clients/package.sh check; the clients stage below serves the sample services from them).
timed deb run_counted_suites deb scripts/test-package.sh
timed pgxn run_counted_suites pgxn scripts/test-pgxn.sh
timed metrics run_counted_suites metrics contrib/prometheus/test.sh
timed clientpkg run_counted_suites clientpkg clients/package.sh check

# The managed edition (issue 40; scripts/test-managed.sh, about 1-2 minutes): pg_tle built from
# ../shared/vendor/pg_tle-2f4b7b3.tar.gz into a throwaway copy of PostgreSQL 15 without the C edition, the edition
# installed through pg_tle and as the plain script, the sql/ files and isolation specs of managed/SUPPORTED against
# both, the pg_cron sweep as the table's owner, the fingerprint cross-check with the C edition installed above, and
# moving keys between the editions both ways. Without the tarball it prints "managed SKIPPED: ...".
timed managed run_counted_suites managed scripts/test-managed.sh

# The Go, Node.js and Python clients: each language's own tests, then one end-to-end suite over real HTTP for
# all three services, directly and through PgBouncer, and a load test per service (clients/run-tests.sh).
timed clients run_counted_suites clients clients/run-tests.sh

# PostgreSQL 17 and 18, built from Debian's source packages into /opt/idem-pg (skipped when built already):
# pg_regress, isolation, pgTAP and the worker's TAP test on each, and pg_upgrade from 15 to 17.
# IDEM_TEST_VERSIONS=0 skips the stage. Debian 15.20 writes a pg_attver column option that 17.11 rejects
# in pg_upgrade; the upgrade test strips it from its throwaway 15 cluster (scripts/test-versions.sh).
if [ "${IDEM_TEST_VERSIONS:-1}" = 1 ]; then
    IDEM_UPGRADE_STRIP_ATTVER=1 timed versions run_counted_suites versions scripts/test-versions.sh 17 18
fi

# PostgreSQL 17 with Citus 14.0.1 built from ../shared/vendor/citus-14.0.1.tar.gz (or $IDEM_CITUS_TARBALL; the
# build is reused): a coordinator and two workers, the supported layout, its refusals, the semantics from every
# node, the sweepers and a load with a worker killed (scripts/test-citus.sh). Without the tarball the summary says
# "citus SKIPPED: ..." instead. IDEM_TEST_CITUS=0 leaves the stage out.
if [ "${IDEM_TEST_CITUS:-1}" = 1 ]; then
    timed citus run_counted_suites citus scripts/test-citus.sh
fi

echo
echo "== wall time per stage (total $(( $(date +%s) - started ))s)"
cat "$log_dir/times"
echo
echo "== summary"
cat "$log_dir/summary"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
