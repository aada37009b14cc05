#!/usr/bin/env bash
# Random SQL from sqlsmith (fixed seed), then random_args.sql (random edge-case arguments to the idem_*
# functions), against a throwaway cluster with the extension preloaded and keys stored; checks that no backend
# crashed. About 20 s. See README.md here.   As root, after `make install`:  test/robustness/sqlsmith.sh
# Env: SMITH_PORT (5589), SMITH_SEED (42), SMITH_QUERIES (2000), SMITH_CALLS (20000), SMITH_STORAGE (table |
# partitioned: the active mode; the other table is there too), SMITH_KEEP=1 keeps the logs.
# Ends with "sqlsmith: N queries, N crashes"; exit 0 only when every query ran, no process crashed, the
# postmaster is up, and random_args.sql saw no internal error and no lost claim.
#
# sqlsmith connects as role smith, not a superuser, so random calls cannot read or write server files, signal
# other roles' processes or change server-wide state. smith may use the extension's tables and every idem_*
# function (random arguments to them are the point); --exclude-catalog aims the queries at those tables. In the
# throwaway database EXECUTE is also revoked from PUBLIC on pg_sleep* and set_config (set_config could lift
# sqlsmith's own 1 s statement_timeout, after which a random query may run for ever) and on
# pg_terminate_backend/pg_cancel_backend (sqlsmith's own session).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/test/robustness
source "$root/scripts/lib/cluster.sh"
port=${SMITH_PORT:-5589}
seed=${SMITH_SEED:-42}
queries=${SMITH_QUERIES:-2000}
storage=${SMITH_STORAGE:-table}
dir=$(mktemp -d /tmp/idem-sqlsmith.XXXXXX)
stop() { cluster_ctl "$dir" stop -m immediate 2>/dev/null; }  # the logs in $dir stay for a failure
trap stop EXIT
start_cluster "$dir" "$port" "shared_preload_libraries = 'idempotency'" "max_prepared_transactions = 10" ||
    { echo "cluster did not start"; exit 1; }
export PGHOST=$dir PGPORT=$port PGUSER=postgres

psql -qX -d postgres -v ON_ERROR_STOP=1 -c "CREATE ROLE smith LOGIN" -c "CREATE DATABASE smith" >/dev/null &&
psql -qX -d smith -v ON_ERROR_STOP=1 -v storage="$storage" >"$dir/setup.log" 2>&1 <<'EOF' || { cat "$dir/setup.log"; exit 1; }
CREATE EXTENSION idempotency;
CREATE FUNCTION pg_temp.put(n int, ttl interval, scope text, status int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        PERFORM idem_claim('key-' || i, idem_hash(i::text), ttl, scope);
        PERFORM idem_complete('key-' || i, status, jsonb_build_object('i', i, 'a', repeat('x', i)),
                              jsonb_build_object('Location', '/p/' || i), scope);
    END LOOP;
END $$;
-- Partitions first (they stay), then keys in the active mode: live, expired, several scopes and statuses.
SELECT idem_set_storage('partitioned', partition_interval => interval '1 day');
SELECT idem_set_storage(:'storage');
SELECT pg_temp.put(40, '1 day', '', 201), pg_temp.put(20, '1 millisecond', 'expired', 402),
       pg_temp.put(20, '5 minutes', 'tenant-b', 409);
BEGIN;
SELECT idem_claim('released', idem_hash('r'));
SELECT idem_release('released');
COMMIT;
-- sqlsmith never calls a function returning record: this wrapper lets it reach idem_claim.
CREATE FUNCTION smith_idem_claim(key text, request_hash text, ttl interval, scope text) RETURNS text
    LANGUAGE sql AS $$ SELECT idem_claim(key, request_hash, ttl, scope)::text $$;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO smith;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO smith;
REVOKE EXECUTE ON FUNCTION pg_sleep(float8), pg_sleep_for(interval), pg_sleep_until(timestamptz),
    set_config(text, text, boolean), pg_terminate_backend(integer, bigint), pg_cancel_backend(integer) FROM PUBLIC;
SELECT count(*) AS keys FROM idempotency_keys;
EOF

start=$SECONDS
timeout 600 sqlsmith --target="host=$dir port=$port dbname=smith user=smith" --seed="$seed" \
    --max-queries="$queries" --verbose --dump-all-queries --exclude-catalog >"$dir/queries.sql" 2>"$dir/sqlsmith.err"
smith_status=$?
elapsed=$((SECONDS - start))
psql -qX -d smith -U smith -v ON_ERROR_STOP=1 -v seed="0.$seed" -v calls="${SMITH_CALLS:-20000}" \
    -f "$here/random_args.sql" >"$dir/random_args.out" 2>&1
args_status=$?
args_summary=$(grep -Eo 'random arguments: [0-9]+ calls, .*claim' "$dir/random_args.out")

ran=$(grep -Eo '^queries: [0-9]+' "$dir/sqlsmith.err" | tail -1 | grep -Eo '[0-9]+')
ran=${ran:-0}
# The postmaster logs a backend that dies by a signal (a PANIC aborts) or exits abnormally, then restarts
# every backend. Exit code 1 is a background worker's normal exit.
crash_re='terminated by signal|exited with exit code ([02-9]|[0-9]{2,})'
crashes=$(grep -Ec "$crash_re" "$dir/server.log")
pid=$(head -1 "$dir/data/postmaster.pid" 2>/dev/null)
up=no
[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && pg_isready -q && up=yes
touching=$(perl -ne 'BEGIN { $/ = ";\n" } $n++ if /idem/; END { print $n + 0 }' "$dir/queries.sql")
calling=$(perl -ne 'BEGIN { $/ = ";\n" } $n++ if /idem_(claim|complete|release|hash)\(/; END { print $n + 0 }' \
    "$dir/queries.sql")

echo "most frequent errors (of $queries):"
tac "$dir/sqlsmith.err" | sed '/^queries: /q' | grep -P '^\d+\t' | sort -rn | head -5 | sed 's/^/  /'
echo "storage $storage, seed $seed: sqlsmith ${elapsed} s, exit $smith_status; $touching queries use the" \
    "extension's tables, views or functions, $calling call idem_claim/complete/release/hash"
sed -n '/^ *fn *|/,/^(/p' "$dir/random_args.out" | sed 's/^/  /'
echo "${args_summary:-random arguments: did not finish (see $dir/random_args.out)}; postmaster up: $up"
grep -E "$crash_re" "$dir/server.log" | head -5
echo "sqlsmith: $ran queries, $crashes crashes"
status=0
[ "$smith_status" -eq 0 ] && [ "$ran" -eq "$queries" ] && [ "$crashes" -eq 0 ] && [ "$up" = yes ] &&
    [ "$args_status" -eq 0 ] && [[ $args_summary == *", 0 internal errors, 0 calls lost"* ]] || status=1
stop
trap - EXIT
# Keep the evidence of a failure: server.log, queries.sql (every query, in order), sqlsmith.err.
if [ "$status" -eq 0 ] && [ -z "${SMITH_KEEP:-}" ]; then rm -rf "$dir"; else echo "logs: $dir"; fi
exit "$status"
