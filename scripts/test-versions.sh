#!/usr/bin/env bash
# The extension against newer PostgreSQL majors: scripts/test-versions.sh [MAJOR...] (default "17 18").
# For each MAJOR: builds PostgreSQL from Debian's source package into /opt/idem-pg/MAJOR (scripts/build-pg.sh,
# skipped when already built), builds the extension there with zero warnings, and on a throwaway cluster of that
# version runs pg_regress, the isolation specs, pgTAP and the worker's Perl TAP test. With 17 in the list it also
# upgrades a PostgreSQL 15 cluster holding completed keys (table and partitioned storage) with 17's pg_upgrade and
# checks every key still replays. Ports 56490-56499 (outside the clients' e2e range, 55480-55529).
# Prints one line per suite per version, "<suite>-pgMAJOR N passed, N failed", then the total "N passed, N failed".
# IDEM_VERSIONS_UPGRADE_ONLY=1: only the builds and the pg_upgrade test.
# IDEM_VERSIONS_TAP: the Perl TAP tests to run (default "010_worker.pl"; "all" for every test/tap/*.pl).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/cluster.sh

majors=("$@")
[ ${#majors[@]} -eq 0 ] && majors=(17 18)
pg_root=${IDEM_PG_ROOT:-/opt/idem-pg}
tap_tests=${IDEM_VERSIONS_TAP:-010_worker.pl}
[ "$tap_tests" = all ] && tap_tests=$(cd test/tap && echo *.pl)
started=$(date +%s)

log_dir=$(mktemp -d /tmp/idem-versions-logs.XXXXXX)
chmod 755 "$log_dir"
COUNT_FORMAT='%s %d passed, %d failed\n'
source scripts/lib/count.sh

work=$(mktemp -d /tmp/idem-versions.XXXXXX)
chmod 755 "$work"
clusters=()
cleanup() {
    for c in "${clusters[@]}"; do
        PG_BIN=${c%%|*} stop_cluster "${c#*|}"
    done
    rm -rf "$work" "$log_dir"
}
trap cleanup EXIT

# 15 (Debian's packages), pgTAP and pg_prove come from the project's own dependencies.
scripts/install-deps.sh

# A copy of the sources, built apart from the clone's own build (test.sh's, for 15).
# build_extension PG_CONFIG DIR NAME: builds and installs; a warning fails the suite.
build_extension() {
    local pg_config=$1 dir=$2 name=$3 warnings
    copy_source_tree "$dir"
    if ! make -C "$dir" PG_CONFIG="$pg_config" >"$log_dir/$name.log" 2>&1 ||
        ! make -C "$dir" -s PG_CONFIG="$pg_config" install >>"$log_dir/$name.log" 2>&1; then
        cat "$log_dir/$name.log"
        count "$name" 0 1
        return 1
    fi
    warnings=$(grep -c 'warning:' "$log_dir/$name.log")
    if [ "$warnings" -gt 0 ]; then
        grep -A3 'warning:' "$log_dir/$name.log"
        count "$name" 0 "$warnings"
    else
        count "$name" 1 0
    fi
}

# ---------- pg_upgrade from 15 to 17: completed keys replay after the upgrade ----------

# SQL that stores N completed keys with a week's ttl: key upg-<db>-i, request {"n": i}, body {"id": i}.
store_keys_sql() {
    cat <<EOF
DO \$\$
BEGIN
    FOR i IN 1..$2 LOOP
        PERFORM idem_claim('upg-$1-' || i, idem_hash(jsonb_build_object('n', i)), interval '7 days');
        PERFORM idem_complete('upg-$1-' || i, 201, jsonb_build_object('id', i),
                              jsonb_build_object('Content-Type', 'application/json'));
    END LOOP;
END \$\$;
EOF
}

# How many of the N keys answer replay with their own body and headers.
replays_sql() {
    echo "SELECT count(*) FROM generate_series(1, $2) AS i,
        LATERAL idem_claim('upg-$1-' || i, idem_hash(jsonb_build_object('n', i))) AS c
        WHERE c.outcome = 'replay' AND c.http_status = 201 AND c.response_body = jsonb_build_object('id', i)
          AND c.response_headers = jsonb_build_object('Content-Type', 'application/json')"
}

upgrade_test() {  # upgrade_test NEW_MAJOR
    local new=$1 name=upgrade-pg$1 old_bin=/usr/lib/postgresql/15/bin new_bin=$pg_root/$1/bin
    local dir=$work/upgrade n=50 ok=0 bad=0 got
    local old_port=56495 new_port=56496
    check() {  # check DESCRIPTION EXPECTED ACTUAL
        if [ "$2" = "$3" ]; then ok=$((ok + 1)); echo "ok - $1"; else bad=$((bad + 1)); echo "not ok - $1: expected '$2', got '$3'"; fi
    }
    mkdir -p "$dir" && chown postgres "$dir"
    # Both clusters need this tree's extension: install it into Debian's 15 too.
    build_extension /usr/lib/postgresql/15/bin/pg_config "$work/pg15/src" build-pg15 || { count "$name" 0 1; return; }
    PG_BIN=$old_bin start_cluster "$dir/old" "$old_port" "shared_preload_libraries = 'idempotency'"
    clusters+=("$old_bin|$dir/old")
    local sock_old=$dir/old
    dir_q() { psql -XAtq -h "$1" -p "$2" -U postgres -d "$3" -c "$4"; }
    dir_q "$sock_old" "$old_port" postgres "CREATE DATABASE appdb"
    for db in postgres appdb; do
        dir_q "$sock_old" "$old_port" "$db" "CREATE EXTENSION idempotency"
    done
    dir_q "$sock_old" "$old_port" appdb "SELECT idem_set_storage('partitioned')" >/dev/null
    for db in postgres appdb; do
        store_keys_sql "$db" "$n" | psql -XAtq -h "$sock_old" -p "$old_port" -U postgres -d "$db"
        check "15: $db replays its $n keys" "$n" "$(dir_q "$sock_old" "$old_port" "$db" "$(replays_sql "$db" "$n")")"
    done
    check "15: appdb is partitioned" partitioned "$(dir_q "$sock_old" "$old_port" appdb "SELECT idem_storage_mode()")"
    # Debian's 15.20 writes a column option pg_attver on every column of every table, which 17.11 (the newest
    # postgresql-17 source the mirror serves) rejects: its pg_upgrade fails on any table, the extension's or not.
    # IDEM_UPGRADE_STRIP_ATTVER=1 removes that option from the old catalog first (throwaway cluster only), to
    # test the extension's own upgrade path with such a pair of minor releases.
    if [ "${IDEM_UPGRADE_STRIP_ATTVER:-0}" = 1 ]; then
        for db in postgres appdb template1; do
            dir_q "$sock_old" "$old_port" "$db" "SET allow_system_table_mods = on;
                UPDATE pg_attribute SET attoptions = NULLIF(ARRAY(SELECT o FROM unnest(attoptions) AS o
                    WHERE o NOT LIKE 'pg\_attver=%'), '{}') WHERE attoptions::text LIKE '%pg\_attver=%'" >/dev/null
        done
        echo "# pg_attver stripped from the 15 catalogs (IDEM_UPGRADE_STRIP_ATTVER=1)"
    fi
    PG_BIN=$old_bin cluster_ctl "$dir/old" stop

    # The new cluster: initdb of the new version, the library preloaded there too; pg_upgrade wants it stopped.
    PG_BIN=$new_bin init_cluster "$dir/new" "$new_port" "shared_preload_libraries = 'idempotency'"
    mkdir -p "$dir/run" && chown postgres "$dir/run"
    if su postgres -c "cd '$dir/run' && $new_bin/pg_upgrade -b $old_bin -B $new_bin \
            -d '$dir/old/data' -D '$dir/new/data' -p $old_port -P $new_port -s '$dir/run' -U postgres \
            -o '-c config_file=$dir/old/data/postgresql.conf'" >"$log_dir/pg_upgrade.log" 2>&1; then
        check "pg_upgrade 15 -> $new" 0 0
    else
        cat "$log_dir/pg_upgrade.log"
        for f in $(grep -o '"/[^"]*\.log"' "$log_dir/pg_upgrade.log" | tr -d '"'); do
            echo "== $f"; grep -B3 -A20 -m1 'error:' "$f" || tail -30 "$f"
        done
        check "pg_upgrade 15 -> $new" 0 1
    fi
    rm -rf "$dir/old"
    PG_BIN=$new_bin cluster_ctl "$dir/new" start
    clusters+=("$new_bin|$dir/new")
    check "$new: server version" "$new" "$(dir_q "$dir/new" "$new_port" postgres "SHOW server_version_num" | cut -c1-2)"
    check "$new: appdb still partitioned" partitioned "$(dir_q "$dir/new" "$new_port" appdb "SELECT idem_storage_mode()")"
    for db in postgres appdb; do
        check "$new: $db replays its $n keys" "$n" "$(dir_q "$dir/new" "$new_port" "$db" "$(replays_sql "$db" "$n")")"
        check "$new: $db tampered request answers mismatch" mismatch \
            "$(dir_q "$dir/new" "$new_port" "$db" "SELECT outcome FROM idem_claim('upg-$db-1', idem_hash('{\"n\": 2}'::jsonb))")"
        check "$new: $db new key is claimed" claimed \
            "$(dir_q "$dir/new" "$new_port" "$db" "SELECT outcome FROM idem_claim('upg-$db-new', idem_hash('{}'::jsonb))")"
    done
    # The worker runs on the upgraded cluster.
    got=$(dir_q "$dir/new" "$new_port" postgres "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'")
    check "$new: the launcher runs" 1 "$got"
    PG_BIN=$new_bin cluster_ctl "$dir/new" stop -m fast
    count "$name" "$ok" "$bad"
}

# ---------- each version ----------

for major in "${majors[@]}"; do
    prefix=$pg_root/$major
    pg_config=$prefix/bin/pg_config
    if ! scripts/build-pg.sh "$major" 2>&1 | tee "$log_dir/build-pg$major.log"; then
        count "build-pg$major" 0 1
        continue
    fi
    dir=$work/pg$major
    build_extension "$pg_config" "$dir/src" "build-pg$major" || continue

    if [ "${IDEM_VERSIONS_UPGRADE_ONLY:-0}" = 1 ]; then
        [ "$major" = 17 ] && upgrade_test 17
        continue
    fi
    cluster=$work/pg$major/cluster
    port=$((56490 + major % 10))
    PG_BIN=$prefix/bin
    start_cluster "$cluster" "$port" "shared_preload_libraries = 'idempotency'" "max_prepared_transactions = 10"
    clusters+=("$PG_BIN|$cluster")

    (
        export PGHOST=$cluster PGPORT=$port PGUSER=postgres PATH=$prefix/bin:$PATH
        cd "$dir/src" || exit 1
        make -s PG_CONFIG="$pg_config" installcheck ISOLATION= >"$log_dir/regress.log" 2>&1
        echo "$?" >"$log_dir/regress.status"
        [ -f regression.diffs ] && cat regression.diffs >>"$log_dir/regress.log"
        make -s PG_CONFIG="$pg_config" installcheck REGRESS= >"$log_dir/isolation.log" 2>&1
        echo "$?" >"$log_dir/isolation.status"
        [ -f output_iso/regression.diffs ] && cat output_iso/regression.diffs >>"$log_dir/isolation.log"
        psql -qX -d postgres -c "DROP DATABASE IF EXISTS pgtap_tests" -c "CREATE DATABASE pgtap_tests"
        psql -qX -d pgtap_tests -c "CREATE EXTENSION idempotency"
        pg_prove --psql-bin "$prefix/bin/psql" -v -d pgtap_tests test/pgtap/*.sql >"$log_dir/pgtap.log" 2>&1
        echo "$?" >"$log_dir/pgtap.status"
    )
    for suite in regress isolation; do
        cat "$log_dir/$suite.log"
        count_regress "$suite-pg$major" "$log_dir/$suite.log" "$(cat "$log_dir/$suite.status")"
    done
    cat "$log_dir/pgtap.log"
    count_tap "pgtap-pg$major" "$log_dir/pgtap.log" "$(cat "$log_dir/pgtap.status")"
    PG_BIN=$prefix/bin stop_cluster "$cluster"

    # Perl TAP with this version's PostgreSQL::Test::Cluster, as user postgres from a copy it can read.
    if [ -n "$tap_tests" ]; then
        tests=()
        for t in $tap_tests; do tests+=("test/tap/$t"); done
        pgxs=$(dirname "$(dirname "$("$pg_config" --pgxs)")")  # .../pgxs/src/makefiles/pgxs.mk
        su postgres -c "cd '$dir/src' && TESTDIR='$dir/src' PATH=$prefix/bin:\$PATH \
            PG_REGRESS=$pgxs/test/regress/pg_regress \
            PERL5LIB=$pgxs/test/perl prove -v ${tests[*]}" >"$log_dir/tap.log" 2>&1
        status=$?
        cat "$log_dir/tap.log"
        count_tap "tap-pg$major" "$log_dir/tap.log" "$status"
    fi

    [ "$major" = 17 ] && upgrade_test 17
done

elapsed=$(( $(date +%s) - started ))
echo
echo "== summary (PostgreSQL ${majors[*]}, ${elapsed}s)"
cat "$log_dir/summary"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
