#!/usr/bin/env bash
# The PGXN distribution as a DBA gets it: `make dist` writes dist/idempotency-VERSION.zip (git archive of HEAD:
# commit first), test/pgxn/validate_meta.py checks its META.json against the PGXN Meta Spec (and is shown to
# reject what the spec forbids), then Debian's pgxnclient installs the zip (`pgxn install`) into a throwaway copy
# of the system's PostgreSQL 15 (server, headers and PGXS: the build is relocatable) that holds no file of the
# extension before, `pgxn load` creates the extension in a fresh cluster of that copy that preloads the library, and
# a smoke test plays claim, complete, replay, mismatch and in_progress through it.
# Run as root. Prints "<suite> N passed, N failed" per suite.
#   IDEM_PGXN_PORT   the cluster's port (default 55435)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/cluster.sh
port=${IDEM_PGXN_PORT:-55435}
pg_major=15

log_dir=$(mktemp -d /tmp/idem-pgxn-logs.XXXXXX)
COUNT_FORMAT='%s %d passed, %d failed\n'
source scripts/lib/count.sh
work=$(mktemp -d /tmp/idem-test-pgxn.XXXXXX)
chmod 755 "$work"
prefix=$work/pg
cluster=$work/cluster
trap 'PG_BIN=$prefix/usr/lib/postgresql/$pg_major/bin stop_cluster "$cluster"; rm -rf "$work" "$log_dir"' EXIT

scripts/install-deps.sh core release || { count pgxn-deps 0 1; cat "$log_dir/summary"; exit 1; }

# The distribution, from the committed tree.
zip=$(make -s dist | tail -1)
[ -f "$zip" ] || { echo "make dist wrote no zip"; count pgxn-dist 0 1; cat "$log_dir/summary"; exit 1; }
zip=$root/$zip
count pgxn-dist 1 0
run_single pgxn-meta python3 test/pgxn/validate_meta.py --zip "$zip"

# The validator fails what the spec forbids: each broken copy of META.json must be rejected.
meta_rejects() {
    local ok=0 bad=0 name mutation
    while IFS='|' read -r name mutation; do
        python3 - "$mutation" >"$work/meta-$name.json" <<'EOF'
import json, sys
meta = json.load(open("META.json"))
exec(sys.argv[1])
print(json.dumps(meta))
EOF
        if python3 test/pgxn/validate_meta.py "$work/meta-$name.json" >/dev/null; then
            echo "not ok: validate_meta.py accepted META.json with $name"
            bad=$((bad + 1))
        else
            ok=$((ok + 1))
        fi
    done <<'EOF'
two-part version|meta["version"] = "1.3"
two-part extension version|meta["provides"]["idempotency"]["version"] = "1.3"
no license|del meta["license"]
unknown license|meta["license"] = "PostgreSQL License"
no provides|meta["provides"] = {}
no maintainer|del meta["maintainer"]
name with a space|meta["name"] = "idem potency"
unknown key|meta["homepage"] = "https://example.org"
bad version range|meta["prereqs"]["runtime"]["requires"]["PostgreSQL"] = "15"
meta-spec 2|meta["meta-spec"]["version"] = "2.0.0"
bad release_status|meta["release_status"] = "beta"
EOF
    count pgxn-meta-rejects "$ok" "$bad"
}
meta_rejects

# A throwaway PostgreSQL: a copy of Debian's 15 without any file of this extension in it.
mkdir -p "$prefix/usr/lib/postgresql" "$prefix/usr/share/postgresql" "$prefix/usr/include"
cp -a /usr/lib/postgresql/$pg_major "$prefix/usr/lib/postgresql/"
cp -a /usr/share/postgresql/$pg_major "$prefix/usr/share/postgresql/"
cp -a /usr/include/postgresql "$prefix/usr/include/"
rm -rf "$prefix/usr/lib/postgresql/$pg_major/lib/idempotency.so" \
    "$prefix/usr/lib/postgresql/$pg_major/lib/bitcode/idempotency"* \
    "$prefix/usr/share/postgresql/$pg_major/extension/idempotency"*
pg_bin=$prefix/usr/lib/postgresql/$pg_major/bin
pg_config=$pg_bin/pg_config
# pgxnclient checks that pg_config's libdir is writable before it installs: the copy has none of its own.
mkdir -p "$($pg_config --libdir)"

run_single pgxn-install pgxn install --yes --pg_config "$pg_config" "$zip"
installed() {
    local f
    for f in "$($pg_config --pkglibdir)/idempotency.so" "$($pg_config --sharedir)/extension/idempotency.control" \
        "$($pg_config --sharedir)/extension/idempotency--1.0.sql"; do
        [ -f "$f" ] || { echo "pgxn install did not install $f"; return 1; }
    done
}
run_single pgxn-installed installed

# The smoke test: a cluster of the throwaway server that preloads what pgxn installed.
smoke() {
    local ok=0 bad=0 got
    PG_BIN=$pg_bin start_cluster "$cluster" "$port" "shared_preload_libraries = 'idempotency'" \
        "max_prepared_transactions = 10" || return 1
    export PGHOST=$cluster PGPORT=$port PGUSER=postgres
    psql -qX -d postgres -c "CREATE DATABASE pgxn_smoke" || return 1
    # pgxn load runs CREATE EXTENSION for each extension META.json provides
    pgxn load --yes --pg_config "$pg_config" -d pgxn_smoke "$zip" || return 1
    sql() { psql -qXAt -v ON_ERROR_STOP=1 -d pgxn_smoke -c "$1"; }
    expect() {  # expect WHAT GOT WANT
        if [ "$2" = "$3" ]; then ok=$((ok + 1)); echo "ok - $1"; else bad=$((bad + 1)); echo "not ok - $1: got '$2', want '$3'"; fi
    }
    expect "installed version" "$(sql "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" \
        "$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)"
    got=$(sql "BEGIN; SELECT outcome FROM idem_claim('pgxn-1', idem_hash('{\"amount\": 100}'::jsonb));
               SELECT idem_complete('pgxn-1', 201, '{\"payment_id\": 7}'); COMMIT;" | head -1)
    expect "first call claims" "$got" claimed
    expect "retry replays the stored response" \
        "$(sql "SELECT outcome || ' ' || http_status || ' ' || response_body FROM idem_claim('pgxn-1', idem_hash('{\"amount\": 100}'::jsonb))")" \
        'replay 201 {"payment_id": 7}'
    expect "another body is a mismatch" \
        "$(sql "SELECT outcome FROM idem_claim('pgxn-1', idem_hash('{\"amount\": 999}'::jsonb))")" mismatch
    # A prepared transaction keeps its claim: another session is answered in_progress at once.
    sql "BEGIN; SELECT outcome FROM idem_claim('pgxn-2', idem_hash('{}'::jsonb)); PREPARE TRANSACTION 'pgxn_held'" >/dev/null
    expect "a key held by another transaction is in_progress" \
        "$(sql "SELECT outcome || ' ' || http_status FROM idem_claim('pgxn-2', idem_hash('{}'::jsonb))")" "in_progress 409"
    sql "ROLLBACK PREPARED 'pgxn_held'"
    expect "a rolled-back claim frees the key" "$(sql "SELECT outcome FROM idem_claim('pgxn-2', idem_hash('{}'::jsonb))")" claimed
    expect "the library is preloaded (shared counters)" "$(sql "SELECT shared FROM idem_stats")" t
    expect "the sweeper's launcher runs" \
        "$(sql "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'")" 1
    unset PGHOST PGPORT PGUSER
    count pgxn-smoke "$ok" "$bad"
}
smoke || count pgxn-smoke 0 1

cat "$log_dir/summary"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
