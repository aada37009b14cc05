#!/usr/bin/env bash
# The managed edition (issue 40) as a managed service runs it: no C library of this extension anywhere.
#   1. `make managed` writes dist/idempotency-pgtle.sql and dist/idempotency-managed.sql;
#   2. a throwaway copy of PG_CONFIG's PostgreSQL (server, headers, PGXS) without any file of the C edition, with
#      pg_tle built into it from the vendored source (scripts/build-pgtle.sh) and pg_cron as it is there;
#   3. one cluster of that copy with shared_preload_libraries = 'pg_tle, pg_cron' only: database tle gets the
#      extension through pg_tle (CREATE EXTENSION pg_tle; psql -f dist/idempotency-pgtle.sql; CREATE EXTENSION
#      idempotency), database plain the plain script (run twice: the second run is its update); every pg_regress
#      file but the c-only ones of managed/SUPPORTED runs against each, compared with the C edition's expected/
#      files after managed/regress-filter.py drops the CONTEXT lines that name the managed edition's own
#      functions; the isolation specs the same way, and pgTAP's test/pgtap files with pg_prove (each c-only line must name an entry of
#      managed/DIFFERENCES.md; a not-yet regress or isolation line fails);
#   3b. the clients' e2e suite (go, node, python, java and ruby-sinatra, the reference services, direct and through PgBouncer) against the
#      managed edition's plain script in a stack of that copy (clients/e2e/harness.py, IDEM_E2E_EDITION=managed);
#   4. the fingerprint cross-check: a cluster of PG_CONFIG's own PostgreSQL, where the C edition is installed, with
#      the C edition in one database and the plain script in another; test/managed/crosscheck.sql computes
#      idem_hash and idem_fingerprint over a generated corpus in both, and every digest must be equal.
# Run as root. Prints "<suite> N passed, N failed" per suite, then "managed N passed, N failed".
#   PG_CONFIG          the PostgreSQL to copy and to cross-check against (default the system's 15)
#   IDEM_MANAGED_PORT  the first of the two ports used (default 55470; the second is one more)
#   IDEM_E2E_PORT_BASE the clients' e2e stack's ports (base .. base+49; default 55480); IDEM_MANAGED_E2E=0 skips it
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/cluster.sh
pg_config_src=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
port=${IDEM_MANAGED_PORT:-55470}
start_time=$(date +%s)

# What pg_tle's build and the pg_cron sweep need (libkrb5-dev, postgresql-15-cron), installed when missing, as
# clients/run-tests.sh does for its group: a fresh machine has only the groups scripts/test.sh installs.
scripts/install-deps.sh managed || { echo "managed-setup 0 passed, 1 failed"; exit 1; }

log_dir=$(mktemp -d /tmp/idem-managed-logs.XXXXXX)
COUNT_FORMAT='%s %d passed, %d failed\n'
source scripts/lib/count.sh
work=$(mktemp -d /tmp/idem-test-managed.XXXXXX)
chmod 755 "$work" "$log_dir"
prefix=$work/pg
pg_bin=$prefix/usr/lib/postgresql/15/bin
src_bin=$("$pg_config_src" --bindir)
finish() {
    PG_BIN=$pg_bin stop_cluster "$work/cluster" 2>/dev/null
    PG_BIN=$src_bin stop_cluster "$work/cross" 2>/dev/null
    rm -rf "$work"
}
trap finish EXIT
summary() {
    cat "$log_dir/summary"
    echo "managed $passed passed, $failed failed ($(( $(date +%s) - start_time ))s; logs in $log_dir)"
}

# 1. The two files, from the sources.
if make -s managed >"$log_dir/make-managed.log" 2>&1; then count managed-generate 1 0
else cat "$log_dir/make-managed.log"; count managed-generate 0 1; summary; exit 1; fi

# 2. PostgreSQL without the C edition, with pg_tle.
mkdir -p "$prefix/usr/lib/postgresql" "$prefix/usr/share/postgresql" "$prefix/usr/include"
cp -a "$src_bin/.." "$prefix/usr/lib/postgresql/15"
cp -a "$("$pg_config_src" --sharedir)" "$prefix/usr/share/postgresql/15"
cp -a "$("$pg_config_src" --includedir)" "$prefix/usr/include/postgresql"
rm -rf "$prefix/usr/lib/postgresql/15/lib/idempotency.so" "$prefix/usr/lib/postgresql/15/lib/bitcode/idempotency"* \
    "$prefix/usr/share/postgresql/15/extension/idempotency"* \
    "$prefix/usr/lib/postgresql/15/lib/pg_tle.so" "$prefix/usr/lib/postgresql/15/lib/.idem-pgtle-built"
PG_CONFIG=$pg_bin/pg_config scripts/build-pgtle.sh >"$log_dir/build-pgtle.log" 2>&1
status=$?
if [ $status -eq 3 ]; then
    cat "$log_dir/build-pgtle.log"
    echo "managed SKIPPED: no pg_tle source (../shared/vendor/pg_tle-2f4b7b3.tar.gz)"; exit 3
elif [ $status -ne 0 ]; then
    cat "$log_dir/build-pgtle.log"; count managed-pgtle-build 0 1; summary; exit 1
fi
count managed-pgtle-build 1 0
if [ ! -f "$prefix/usr/lib/postgresql/15/lib/pg_cron.so" ]; then
    echo "pg_cron is not in $src_bin/..: install postgresql-15-cron (scripts/install-deps.sh managed)"
    count managed-pg-cron 0 1; summary; exit 1
fi

# 3. The cluster without the C library, the two ways in.
cluster=$work/cluster
# Unix sockets only, pg_cron's connections too: on a busy machine a client's ephemeral TCP port can be the one
# asked for, and the server then fails to bind it.
if ! PG_BIN=$pg_bin start_cluster "$cluster" "$port" "shared_preload_libraries = 'pg_tle, pg_cron'" \
        "cron.database_name = 'plain'" "cron.host = '$cluster'" "listen_addresses = ''" \
        "max_prepared_transactions = 10"; then
    count managed-cluster 0 1; summary; exit 1
fi
psql_m() { "$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$cluster" -p "$port" -U postgres "$@"; }
install_ok=0 install_bad=0
step() {  # step NAME COMMAND...: one installation step, logged
    if "$@" >>"$log_dir/install.log" 2>&1; then install_ok=$((install_ok + 1))
    else echo "install step failed: $*"; install_bad=$((install_bad + 1)); fi
}
step psql_m -d postgres -c "CREATE DATABASE tle" -c "CREATE DATABASE plain"
step psql_m -d tle -c "CREATE EXTENSION pg_tle"
# As on RDS: registered and created by a role that is not superuser, a member of pgtle_admin with CREATE on the
# database and its schema.
step psql_m -d tle -c "CREATE ROLE idem_tle_admin LOGIN" -c "GRANT pgtle_admin TO idem_tle_admin" \
    -c "GRANT CREATE ON DATABASE tle TO idem_tle_admin" -c "GRANT CREATE ON SCHEMA public TO idem_tle_admin"
step psql_m -d tle -U idem_tle_admin -f "$root/dist/idempotency-pgtle.sql"
# Registered already: a second run changes nothing.
step psql_m -d tle -U idem_tle_admin -f "$root/dist/idempotency-pgtle.sql"
step psql_m -d tle -U idem_tle_admin -c "CREATE EXTENSION idempotency"
step psql_m -d plain -f "$root/dist/idempotency-managed.sql"
step psql_m -d plain -f "$root/dist/idempotency-managed.sql"
tail -20 "$log_dir/install.log" | grep -i error
count managed-install "$install_ok" "$install_bad"

# The update through pg_tle (managed/README.md, "Releases"): this version frozen as a release would freeze it,
# then a test-only next version generated after it (test/managed/update-next.sql added), which registers both
# and the update path between them. A database on this version, with the keys of test/managed/move-setup.sql,
# is updated by ALTER EXTENSION idempotency UPDATE (as idem_tle_admin, not superuser) and keeps every key
# (test/managed/move-check.sql), and the next version's function answers.
upd=$work/update
mkdir -p "$upd/releases"
[ -d managed/releases ] && cp -a managed/releases/. "$upd/releases/"
this_version=$(sed -n 's/^EXTVERSION *= *//p' Makefile)
next_version=$this_version.99
install_ok=0 install_bad=0
step python3 managed/generate.py "$upd/this" --releases "$upd/releases" --freeze
step env IDEM_MANAGED_VERSION="$next_version" IDEM_MANAGED_TEST_SQL=test/managed/update-next.sql \
    python3 managed/generate.py "$upd/next" --releases "$upd/releases"
step psql_m -d postgres -c "CREATE DATABASE tle_update"
step psql_m -d tle_update -c "CREATE EXTENSION pg_tle" -c "GRANT CREATE ON DATABASE tle_update TO idem_tle_admin" \
    -c "GRANT CREATE ON SCHEMA public TO idem_tle_admin"
step psql_m -d tle_update -U idem_tle_admin -f "$upd/this/idempotency-pgtle.sql"
step psql_m -d tle_update -U idem_tle_admin -c "CREATE EXTENSION idempotency" -f test/managed/move-setup.sql
# The next file registers the next version and the path; run again, it changes nothing.
step psql_m -d tle_update -U idem_tle_admin -f "$upd/next/idempotency-pgtle.sql"
step psql_m -d tle_update -U idem_tle_admin -f "$upd/next/idempotency-pgtle.sql"
step psql_m -d tle_update -U idem_tle_admin -c "ALTER EXTENSION idempotency UPDATE"
count managed-update-setup "$install_ok" "$install_bad"
{
    psql_m -d tle_update -At -c "SELECT CASE WHEN extversion = '$next_version' THEN 'ok' ELSE 'not ok' END
        || ' updated to the next version (' || extversion || ')' FROM pg_extension WHERE extname = 'idempotency'"
    psql_m -d tle_update -At -c "SELECT CASE WHEN idem_managed_test_next() = 'next' THEN 'ok' ELSE 'not ok' END
        || ' the next version''s function answers'"
    psql_m -d tle_update -At -f test/managed/move-check.sql
} >"$work/update.txt" 2>&1
ok=$(grep -c '^ok' "$work/update.txt")
bad=$(grep -c -v '^ok' "$work/update.txt")
# Every promise answered: two here, one per check of move-check.sql.
[ "$ok" -eq $((2 + $(grep -c "'not ok'" test/managed/move-check.sql))) ] || bad=$((bad + 1))
[ "$bad" -eq 0 ] || { echo "not ok: the update through pg_tle:"; grep -v '^ok' "$work/update.txt"; }
count managed-update "$ok" "$bad"

# Expiry through pg_cron, started now and checked at the end (pg_cron 1.4 runs a job at most once a minute): a
# database owned by a role that is not superuser, the plain script installed by it, 300 expired keys and 10
# live ones; the job runs as that role.
install_ok=0 install_bad=0
step psql_m -d postgres -c "CREATE ROLE idem_cron_owner LOGIN" -c "CREATE DATABASE cron_owned OWNER idem_cron_owner"
step psql_m -d cron_owned -U idem_cron_owner -f "$root/dist/idempotency-managed.sql"
step psql_m -d cron_owned -U idem_cron_owner -c "INSERT INTO idempotency_keys (expires_at, created_at, http_status,
    scope, key, request_hash) SELECT now() + CASE WHEN i <= 300 THEN interval '-1 hour' ELSE interval '1 hour' END,
    now(), 200, '', 'k' || i, '\\x00' FROM generate_series(1, 310) i"
step psql_m -d plain -c "CREATE EXTENSION pg_cron" -c "SELECT cron.schedule_in_database('idempotency-expiry',
    '* * * * *', 'CALL idem_managed_sweep()', 'cron_owned', 'idem_cron_owner')"
count managed-cron-setup "$install_ok" "$install_bad"

# What runs: every sql/*.sql and every isolation spec, unless managed/SUPPORTED lists it as c-only (a new
# SQL-level test runs on the managed edition by default). Each c-only line must name an existing file and an
# entry of managed/DIFFERENCES.md (the bold lead text of a list item, or a heading) that it is about; a not-yet
# line fails.
c_only() { grep -Eq "^c-only $1 $2:" managed/SUPPORTED; }
supported='' iso_supported=''
for f in sql/*.sql; do n=$(basename "$f" .sql); c_only regress "$n" || supported="$supported $n"; done
for f in test/isolation/specs/*.spec; do n=$(basename "$f" .spec); c_only isolation "$n" || iso_supported="$iso_supported $n"; done
entries=$(sed -n -E 's/^- \*\*([^*]+)\*\*.*/\1/p; s/^#+ +(.*)/\1/p' managed/DIFFERENCES.md | sed 's/\.$//')
listed_ok=0 listed_bad=0
while read -r keyword kind rest; do
    name=${rest%%:*}
    entry=$(printf '%s' "${rest#*:}" | sed 's/^ *//; s/\.$//')
    case $kind in regress) f=sql/$name.sql ;; pgtap) f=test/pgtap/$name.sql ;; *) f=test/isolation/specs/$name.spec ;; esac
    if [ ! -f "$f" ]; then
        echo "not ok: managed/SUPPORTED lists $kind $name, which does not exist"; listed_bad=$((listed_bad + 1))
    elif [ "$keyword" = not-yet ]; then
        echo "not ok: managed/SUPPORTED: $kind $name is not-yet (it must run on both editions, or be c-only)"
        listed_bad=$((listed_bad + 1))
    elif [ "$keyword" = c-only ] && ! grep -Fxq -- "$entry" <<<"$entries"; then
        echo "not ok: managed/SUPPORTED: c-only $kind $name names '$entry', which is no entry of managed/DIFFERENCES.md"
        listed_bad=$((listed_bad + 1))
    else
        listed_ok=$((listed_ok + 1))
    fi
done < <(grep -E '^(not-yet|c-only) ' managed/SUPPORTED)
count managed-supported-listed "$listed_ok" "$listed_bad"

# pg_regress, in a directory user postgres can write to; the C edition's sql/ and expected/ as they are.
regress_dir=$work/regress
mkdir -p "$regress_dir"
cp -a sql expected "$regress_dir/"
chown -R postgres "$regress_dir"
pg_regress=$(dirname "$("$pg_bin/pg_config" --pgxs)")/../../src/test/regress/pg_regress
for db in tle plain; do
    ok=0 bad=0
    for t in $supported; do
        # One pg_regress run per file, each from an empty key table: the C edition's run of all files in one
        # database leans on the files between (lean_request finds the table emptied by in_flight's TRUNCATE).
        psql_m -d "$db" -c "TRUNCATE idempotency_keys" >>"$log_dir/regress-$db.log" 2>&1
        (cd "$regress_dir" && su postgres -c "$(printf '%q ' "$pg_regress" --inputdir=. --outputdir="out-$db" \
            --bindir="$pg_bin" --host="$cluster" --port="$port" --user=postgres --use-existing --dbname="$db" \
            "$t")") >>"$log_dir/regress-$db.log" 2>&1
        if python3 managed/regress-filter.py "$regress_dir/out-$db/results/$t.out" >"$regress_dir/$t-$db.filtered" &&
           diff -u "$regress_dir/expected/$t.out" "$regress_dir/$t-$db.filtered" >"$log_dir/$t-$db.diff"; then
            ok=$((ok + 1))
            rm -f "$log_dir/$t-$db.diff"
        else
            echo "not ok: managed ($db) $t: $log_dir/$t-$db.diff"
            bad=$((bad + 1))
        fi
    done
    count "managed-regress-$db" "$ok" "$bad"
done

# The isolation specs, the same way: test/isolation's specs and expected files as they are.
iso_dir=$work/isolation
mkdir -p "$iso_dir"
cp -a test/isolation/specs test/isolation/expected "$iso_dir/"
chown -R postgres "$iso_dir"
pg_isolation_regress=$(dirname "$("$pg_bin/pg_config" --pgxs)")/../../src/test/isolation/pg_isolation_regress
for db in tle plain; do
    ok=0 bad=0
    for t in $iso_supported; do
        psql_m -d "$db" -c "TRUNCATE idempotency_keys" >>"$log_dir/isolation-$db.log" 2>&1
        (cd "$iso_dir" && su postgres -c "$(printf '%q ' "$pg_isolation_regress" --inputdir=. \
            --outputdir="out-$db" --bindir="$pg_bin" --host="$cluster" --port="$port" --user=postgres \
            --use-existing --dbname="$db" "$t")") >>"$log_dir/isolation-$db.log" 2>&1
        if python3 managed/regress-filter.py "$iso_dir/out-$db/results/$t.out" >"$iso_dir/$t-$db.filtered" &&
           diff -u "$iso_dir/expected/$t.out" "$iso_dir/$t-$db.filtered" >"$log_dir/iso-$t-$db.diff"; then
            ok=$((ok + 1))
            rm -f "$log_dir/iso-$t-$db.diff"
        else
            echo "not ok: managed ($db) isolation $t: $log_dir/iso-$t-$db.diff"
            bad=$((bad + 1))
        fi
    done
    count "managed-isolation-$db" "$ok" "$bad"
done

# pgTAP (test/pgtap, the API contract), unchanged, against each installation: every file unless managed/SUPPORTED
# lists it as c-only. Each file runs in a transaction it rolls back, creating pgTAP there (PG_CONFIG's copy of
# Debian's postgresql-15-pgtap, copied above with the rest of its share directory).
pgtap_supported=''
for f in test/pgtap/*.sql; do n=$(basename "$f" .sql); c_only pgtap "$n" || pgtap_supported="$pgtap_supported $f"; done
for db in tle plain; do
    if [ -z "$pgtap_supported" ]; then count "managed-pgtap-$db" 0 0; continue; fi
    # shellcheck disable=SC2086  # a list of files
    pg_prove --psql-bin "$pg_bin/psql" -v -h "$cluster" -p "$port" -U postgres -d "$db" $pgtap_supported \
        >"$log_dir/pgtap-$db.log" 2>&1
    status=$?
    [ "$status" -ne 0 ] && { echo "not ok: managed ($db) pgTAP:"; grep -E '^ *not ok|^#|ERROR' "$log_dir/pgtap-$db.log" | head -20; }
    count_tap "managed-pgtap-$db" "$log_dir/pgtap-$db.log" "$status"
done

# The in-flight rule's collisions (managed/README.md): another holder of the key's 64-bit advisory lock (here an
# application's pg_advisory_xact_lock on that number, as a second key of the same hash would take it) makes a
# claim of the free key answer in_progress at once, never claimed; once it ends the key is claimed.
lock_no=$(psql_m -d plain -At -c "SELECT pg_catalog.hashtextextended(E'\\x1f' || 'collide', 7655)")
psql_m -d plain -c "BEGIN" -c "SELECT pg_advisory_xact_lock($lock_no)" -c "SELECT pg_sleep(30)" -c "COMMIT" \
    >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 100); do
    held=$(psql_m -d plain -At -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
        AND ((classid::bigint << 32) | objid::bigint) = $lock_no AND objsubid = 1")
    [ "$held" = 1 ] && break
    sleep 0.1
done
during=$(psql_m -d plain -At -c "SELECT outcome || ' ' || http_status FROM idem_claim('collide', idem_hash('x'))")
kill "$holder" 2>/dev/null
psql_m -d plain -c "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'
    AND ((classid::bigint << 32) | objid::bigint) = $lock_no" >/dev/null
wait "$holder" 2>/dev/null
after=$(psql_m -d plain -At -c "SELECT outcome FROM idem_claim('collide', idem_hash('x'))")
if [ "$held" = 1 ] && [ "$during" = "in_progress 409" ] && [ "$after" = claimed ]; then count managed-collision 1 0
else
    echo "not ok: a claim beside another holder of its lock answered '$during' (lock held: $held), then '$after'"
    count managed-collision 0 1
fi

# idempotency.tombstone_ttl is a placeholder here (SET takes any text: managed/DIFFERENCES.md), so the managed
# edition refuses a bad value where it reads it: a claim that finds no live row and the sweep answer 22023 for a
# value past 3650 days, below 0, or no time at all, and write nothing.
ok=0 bad=0
for value in "'3651d'" "-1" "'bogus'"; do
    for query in "SELECT idem_claim('ts-bad', idem_hash('x'))" "SELECT idem_cleanup()"; do
        out=$(psql_m -d plain -v VERBOSITY=sqlstate -c "SET idempotency.tombstone_ttl = $value" -c "$query" 2>&1)
        if [ "$out" = "ERROR:  22023" ]; then ok=$((ok + 1))
        else echo "not ok: tombstone_ttl = $value, $query: $out"; bad=$((bad + 1)); fi
    done
done
left=$(psql_m -d plain -At -c "SELECT count(*) FROM idempotency_keys WHERE key = 'ts-bad'")
[ "$left" = 0 ] && ok=$((ok + 1)) || { echo "not ok: a refused claim wrote key ts-bad"; bad=$((bad + 1)); }
count managed-tombstone-ttl "$ok" "$bad"

# Partitioned storage claims under READ COMMITTED only (managed/DIFFERENCES.md): no unique index spans the
# partitions, so under REPEATABLE READ or SERIALIZABLE a completion committed after the snapshot would be missed
# and the request run twice; the claim is refused with 0A000 and writes nothing, and READ COMMITTED claims.
ok=0 bad=0
psql_m -d postgres -c "CREATE DATABASE rr_parts" >/dev/null 2>&1
psql_m -d rr_parts -f "$root/dist/idempotency-managed.sql" >/dev/null 2>&1
psql_m -d rr_parts -c "SELECT idem_set_storage('partitioned')" >/dev/null 2>&1
for level in "REPEATABLE READ" "SERIALIZABLE"; do
    for query in "SELECT idem_claim('rr', idem_hash('x'))" \
                 "SELECT idem_lease('rr', idem_hash('x'), interval '1 min')" \
                 "SELECT idem_claim_request('rr', '', 'POST', '/p', NULL, NULL, NULL)"; do
        out=$(psql_m -d rr_parts -v VERBOSITY=sqlstate -c "BEGIN ISOLATION LEVEL $level" -c "$query" 2>&1 | grep ERROR)
        if [ "$out" = "ERROR:  0A000" ]; then ok=$((ok + 1))
        else echo "not ok: partitioned storage, $level, $query: $out"; bad=$((bad + 1)); fi
    done
done
out=$(psql_m -d rr_parts -At -c "SELECT count(*) FROM idempotency_keys_partitioned WHERE key = 'rr'" \
      -c "SELECT outcome FROM idem_claim('rr', idem_hash('x'))" 2>&1 | tr '\n' ' ')
[ "$out" = "0 claimed " ] && ok=$((ok + 1)) || { echo "not ok: after the refusals, READ COMMITTED: $out"; bad=$((bad + 1)); }
count managed-rr-partitioned "$ok" "$bad"

# Key characters in a LATIN1 database: regress limits_latin1 makes a database of its own and runs CREATE EXTENSION
# there, so it runs on the C edition only (managed/DIFFERENCES.md, "Installed in each database"); here the same
# claims run against the plain script in such a database, compared with that file's expected output.
psql_m -d postgres -c "CREATE DATABASE latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0" \
    >/dev/null 2>&1
psql_m -d latin1 -f "$root/dist/idempotency-managed.sql" >/dev/null 2>&1
latin1_part='/^SET client_encoding/,/^SELECT count\(\*\) AS rows_written/'
sed -n -E "${latin1_part}p" sql/limits_latin1.sql | grep -v '^CREATE EXTENSION' >"$work/latin1.sql"
sed -n -E "${latin1_part}p" expected/limits_latin1.out | grep -v '^CREATE EXTENSION' >"$work/latin1.expected"
sed -n '/^SELECT count(\*) AS rows_written/,/^(1 row)/p' expected/limits_latin1.out | tail -n +2 >>"$work/latin1.expected"
echo >>"$work/latin1.expected"  # psql's blank line after the last result
PG_ABS_SRCDIR=$root "$pg_bin/psql" -X -a -q -h "$cluster" -p "$port" -U postgres -d latin1 <"$work/latin1.sql" \
    >"$work/latin1.out" 2>&1
python3 managed/regress-filter.py "$work/latin1.out" >"$work/latin1.filtered"
claims=$(grep -c '^SELECT sqlstate_of' "$work/latin1.sql")
if [ "$claims" -ge 5 ] && diff -u "$work/latin1.expected" "$work/latin1.filtered" >"$log_dir/latin1.diff"; then
    count managed-latin1 "$claims" 0
else
    echo "not ok: key characters in a LATIN1 database: $log_dir/latin1.diff"; head -20 "$log_dir/latin1.diff"
    count managed-latin1 0 1
fi

# The expiry job: every expired key gone, the live ones kept, the run succeeded as the owner.
for _ in $(seq 1 90); do
    left=$(psql_m -d cron_owned -At -c "SELECT count(*) FROM idempotency_keys WHERE expires_at <= now()")
    [ "$left" = 0 ] && break
    sleep 1
done
runs=$(psql_m -d plain -At -c "SELECT count(*) FROM cron.job_run_details d JOIN cron.job j USING (jobid)
    WHERE j.jobname = 'idempotency-expiry' AND d.status = 'succeeded' AND d.username = 'idem_cron_owner'")
live=$(psql_m -d cron_owned -At -c "SELECT count(*) FROM idempotency_keys WHERE expires_at > now()")
if [ "$left" = 0 ] && [ "$live" = 10 ] && [ "${runs:-0}" -ge 1 ]; then count managed-cron 1 0
else
    echo "not ok: the pg_cron job left $left expired and $live live keys ($runs runs succeeded as the owner)"
    psql_m -d plain -c "SELECT status, username, return_message FROM cron.job_run_details" | tail -5
    count managed-cron 0 1
fi

# The sweep's partition upkeep in partitioned storage, as the key table's owner (not superuser): the expired
# partition dropped with its keys, the partitions ahead made again (test/managed/sweep-partitions.sql).
psql_m -d postgres -c "CREATE DATABASE sweep_parts OWNER idem_cron_owner" >/dev/null 2>&1
{
    psql_m -d sweep_parts -U idem_cron_owner -f "$root/dist/idempotency-managed.sql" &&
        psql_m -d sweep_parts -U idem_cron_owner -At -f test/managed/sweep-partitions.sql
} >"$work/sweep.txt" 2>&1
ok=$(grep -c '^ok' "$work/sweep.txt")
bad=$(grep -c '^not ok' "$work/sweep.txt")
if [ "$ok" -ne 4 ]; then echo "not ok: the sweep's partition upkeep:"; grep -v '^ok' "$work/sweep.txt" | head -5; fi
judge managed-sweep-partitions $(( ok == 4 ? 0 : 1 )) "$ok" "$bad"

# The clients' e2e suite (clients/e2e, not the load test) against the managed edition: one service per language
# (go, node, python, java and ruby-sinatra, the reference services), each direct and through PgBouncer, in a stack of the copy above (no file
# of the C edition there) whose database gets the plain script (harness.py, IDEM_E2E_EDITION=managed). Skipped
# with IDEM_MANAGED_E2E=0; its ports are IDEM_E2E_PORT_BASE's (55480 by default, the clients' stack's: one stack
# at a time, harness.py takes the lock).
if [ "${IDEM_MANAGED_E2E:-1}" != 0 ]; then
    e2e_start=$(date +%s)
    if scripts/install-deps.sh clients java ruby >"$log_dir/e2e-deps.log" 2>&1; then
        (cd clients/e2e && PG_BIN=$pg_bin IDEM_E2E_EDITION=managed E2E_LANGS=go,node,python,java,ruby-sinatra E2E_REQUIRE_ALL=1 \
            /usr/bin/python3 -m pytest -m "not load" -rfEs --tb=short --junitxml="$log_dir/e2e.xml" test_e2e.py) \
            </dev/null >"$log_dir/e2e.log" 2>&1
        status=$?
        ok=0 bad=0
        [ -f "$log_dir/e2e.xml" ] && read -r ok bad _ < <(/usr/bin/python3 scripts/lib/counts.py junit "$log_dir/e2e.xml")
        [ "$status" -ne 0 ] && { grep -E '^(FAILED|ERROR)' "$log_dir/e2e.log" | head -20; tail -3 "$log_dir/e2e.log"; }
        echo "managed-e2e: $(( $(date +%s) - e2e_start ))s"
        judge managed-e2e "$status" "$ok" "$bad"
    else
        tail -20 "$log_dir/e2e-deps.log"
        count managed-e2e 0 1
    fi
fi

# 4. The fingerprint cross-check against the C edition.
if [ ! -f "$("$pg_config_src" --sharedir)/extension/idempotency.control" ]; then
    echo "not ok: the C edition is not installed in $src_bin/..: nothing to cross-check against (make install there)"
    count managed-crosscheck 0 1
else
    cross=$work/cross
    if PG_BIN=$src_bin start_cluster "$cross" $((port + 1)) "listen_addresses = ''"; then
        psql_c() { "$src_bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$cross" -p $((port + 1)) -U postgres "$@"; }
        psql_c -d postgres -c "CREATE DATABASE c_edition" -c "CREATE DATABASE managed_edition" >/dev/null &&
            psql_c -d c_edition -c "CREATE EXTENSION idempotency" &&
            psql_c -d managed_edition -f "$root/dist/idempotency-managed.sql"
        psql_c -d c_edition -At -f test/managed/crosscheck.sql >"$work/c.txt" 2>&1
        psql_c -d managed_edition -At -f test/managed/crosscheck.sql >"$work/m.txt" 2>&1
        rows=$(grep -c '|' "$work/c.txt")
        if [ "$rows" -gt 1000 ] && cmp -s "$work/c.txt" "$work/m.txt"; then
            count managed-crosscheck "$rows" 0
        else
            diff "$work/c.txt" "$work/m.txt" | head -20
            count managed-crosscheck 0 1
        fi

        # 5. Moving between editions keeps every key: pg_dump of a C edition database restored where the
        # managed edition is registered with pg_tle, then back (without pg_tle's own objects). Both editions must
        # be this tree's: the C edition installed where PG_CONFIG points may be another version of 1.4.
        columns="SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
            FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass AND attnum > 0 AND NOT attisdropped"
        c_columns=$(psql_c -d c_edition -At -c "$columns")
        m_columns=$(psql_c -d managed_edition -At -c "$columns")
        if [ "$c_columns" != "$m_columns" ]; then
            echo "not ok: the C edition installed in $src_bin/.. is not this tree's (its key table has other" \
                 "columns: $c_columns); make install this tree there to test moving between editions"
        fi
        {
            psql_c -d postgres -c "CREATE DATABASE move_from_c" -c "CREATE DATABASE move_back" &&
                psql_c -d move_from_c -c "CREATE EXTENSION idempotency" &&
                psql_c -d move_from_c -f test/managed/move-setup.sql &&
                "$src_bin/pg_dump" -h "$cross" -p $((port + 1)) -U postgres -Fc -f "$work/c.dump" move_from_c &&
                psql_m -d postgres -c "CREATE DATABASE move_to_managed" &&
                psql_m -d move_to_managed -c "CREATE EXTENSION pg_tle" -f "$root/dist/idempotency-pgtle.sql" &&
                "$pg_bin/pg_restore" -h "$cluster" -p "$port" -U postgres --exit-on-error -d move_to_managed \
                    "$work/c.dump" &&
                psql_m -d move_to_managed -At -f test/managed/move-check.sql >"$work/move-1.txt" &&
                "$pg_bin/pg_dump" -h "$cluster" -p "$port" -U postgres -Fc -f "$work/m.dump" move_to_managed &&
                "$src_bin/pg_restore" -l "$work/m.dump" | grep -v -i -e pg_tle -e pgtle >"$work/m.list" &&
                "$src_bin/pg_restore" -h "$cross" -p $((port + 1)) -U postgres --exit-on-error -d move_back \
                    -L "$work/m.list" "$work/m.dump" &&
                psql_c -d move_back -At -f test/managed/move-check.sql >"$work/move-2.txt"
        } >"$log_dir/move.log" 2>&1
        cat "$work/move-1.txt" "$work/move-2.txt" 2>/dev/null | sed 's/^/C -> managed -> C: /' >>"$log_dir/move.log"
        ok=$(cat "$work/move-1.txt" "$work/move-2.txt" 2>/dev/null | grep -c '^ok')
        bad=$(cat "$work/move-1.txt" "$work/move-2.txt" 2>/dev/null | grep -c '^not ok')
        grep '^not ok' "$work/move-1.txt" "$work/move-2.txt" 2>/dev/null
        if [ "$ok" -ne 14 ]; then echo "not ok: moving between editions: see $log_dir/move.log"; tail -5 "$log_dir/move.log"; fi
        judge managed-move $(( ok == 14 ? 0 : 1 )) "$ok" "$bad"
    else
        count managed-crosscheck 0 1
    fi
fi
summary
[ "$failed" -eq 0 ]
