#!/usr/bin/env bash
# The metrics as an operator runs them: promtool checks and unit-tests the alerting rules, then Debian's
# prometheus-postgres-exporter starts with queries.yaml against a throwaway cluster (library preloaded) in which a
# few requests ran, and its /metrics must hold every series queries.yaml defines, with its HELP text and its type
# (counters end in _total), every column of idem_stats must be exposed, the counters must equal idem_stats, and the
# exporter must report no failed query. Run as root (the cluster runs as user postgres), after `make install` into
# the server of PG_BIN (default Debian's 15). Prints "<suite> N passed, N failed" per suite.
#   IDEM_METRICS_PORT   the cluster's port (default 55436); the exporter listens on the next one
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
source scripts/lib/cluster.sh
port=${IDEM_METRICS_PORT:-55436}
web_port=$((port + 1))

log_dir=$(mktemp -d /tmp/idem-metrics-logs.XXXXXX)
COUNT_FORMAT='%s %d passed, %d failed\n'
source scripts/lib/count.sh
work=$(mktemp -d /tmp/idem-metrics.XXXXXX)
chmod 755 "$work"
cluster=$work/cluster
exporter_pid=
cleanup() {
    [ -n "$exporter_pid" ] && kill "$exporter_pid" 2>/dev/null && wait "$exporter_pid" 2>/dev/null
    stop_cluster "$cluster"
    rm -rf "$work" "$log_dir"
}
trap cleanup EXIT

scripts/install-deps.sh release >/dev/null || { count metrics-deps 0 1; cat "$log_dir/summary"; exit 1; }

run_single metrics-rules-check promtool check rules "$here/alerts.yml"
(cd "$here" && promtool test rules alerts_test.yml) 2>&1 | tee "$log_dir/rules-test.log"
if [ "${PIPESTATUS[0]}" -eq 0 ] && grep -q SUCCESS "$log_dir/rules-test.log"; then
    # one assertion per alert_rule_test entry
    count metrics-rules-test "$(grep -c 'alertname:' "$here/alerts_test.yml")" 0
else
    count metrics-rules-test 0 1
fi

# The dashboard and the alerts use only series queries.yaml defines, and every panel's query is valid PromQL
# (promtool checks them as recording rules, with the dashboard's $instance variable as .*).
python3 - "$here" "$work/dashboard-rules.yml" <<'EOF' 2>&1 | tee "$log_dir/names.log"
import json, re, sys, yaml
here, rules_out = sys.argv[1], sys.argv[2]
defined = set()
for prefix, q in yaml.safe_load(open(f"{here}/queries.yaml")).items():
    for m in q["metrics"]:
        (col, spec), = m.items()
        if spec["usage"] != "LABEL":
            defined.add(f"{prefix}_{col}")
dash = json.load(open(f"{here}/grafana-dashboard.json"))
exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
alerts = [r["expr"] for g in yaml.safe_load(open(f"{here}/alerts.yml"))["groups"] for r in g["rules"]]
ok = bad = 0
for where, expr in [("dashboard", e) for e in exprs] + [("alerts.yml", e) for e in alerts]:
    for name in set(re.findall(r"\bidem_[a-z0-9_]+", expr)):
        if name in defined:
            ok += 1
        else:
            bad += 1
            print(f"not ok - {where} uses {name}, which queries.yaml does not define")
rules = [{"record": f"dashboard:panel_{i}", "expr": e.replace("$instance", ".*")} for i, e in enumerate(exprs)]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(rules_out, "w"))
print(f"names {ok} {bad}")
EOF
read -r _ ok bad < <(grep '^names ' "$log_dir/names.log")
judge metrics-names 0 "${ok:-0}" "${bad:-1}"
run_single metrics-dashboard promtool check rules "$work/dashboard-rules.yml"

scrape() {
    local ok=0 bad=0 name type help col value want
    expect() {  # expect WHAT CONDITION-EXIT-STATUS
        if [ "$2" -eq 0 ]; then ok=$((ok + 1)); else bad=$((bad + 1)); echo "not ok - $1"; fi
    }
    start_cluster "$cluster" "$port" "shared_preload_libraries = 'idempotency'" "idempotency.databases = 'app'" || return 1
    export PGHOST=$cluster PGPORT=$port PGUSER=postgres
    psql -qX -d postgres -c "CREATE DATABASE app" && psql -qX -d app -c "CREATE EXTENSION idempotency" || return 1
    # The exporter's role as the README sets it up: pg_monitor and SELECT on the key tables, no superuser.
    psql -qX -v ON_ERROR_STOP=1 -d app -c "CREATE ROLE prometheus LOGIN IN ROLE pg_monitor" \
        -c "GRANT SELECT ON idempotency_keys, idempotency_keys_partitioned TO prometheus" || return 1
    # Some traffic: a completed key and its replay, a mismatch, an in_progress, a 5xx given back, a lease with a
    # checkpoint, an expired key.
    psql -qX -v ON_ERROR_STOP=1 -d app >/dev/null <<'EOF' || return 1
BEGIN; SELECT idem_claim('m-1', idem_hash('{"a": 1}'::jsonb)); SELECT idem_complete('m-1', 201, '{}'); COMMIT;
SELECT idem_claim('m-1', idem_hash('{"a": 1}'::jsonb));
SELECT idem_claim('m-1', idem_hash('{"a": 2}'::jsonb));
BEGIN; SELECT idem_claim('m-2', idem_hash('{}'::jsonb)); SELECT idem_complete('m-2', 503, '{}'); COMMIT;
SELECT idem_checkpoint('m-3', (SELECT lease_token FROM idem_lease('m-3', idem_hash('{}'::jsonb), interval '1 hour')), 'charged');
BEGIN; SELECT idem_claim('m-4', idem_hash('{}'::jsonb)); SELECT idem_complete('m-4', 200, '{}'); COMMIT;
UPDATE idempotency_keys SET expires_at = now() - interval '1 hour', created_at = now() - interval '2 hours' WHERE key = 'm-4';
EOF
    # A session holding a claim in its open transaction (a key in flight); another claim of it is in_progress.
    coproc HOLDER { psql -qXAt -d app; }
    echo "BEGIN; SELECT outcome FROM idem_claim('m-5', idem_hash('{}'::jsonb));" >&"${HOLDER[1]}"
    local held=0
    for _ in $(seq 100); do
        held=$(psql -qXAt -d app -c "SELECT count(*) FROM idem_keys_in_flight() WHERE holder = 'transaction'")
        [ "$held" = 1 ] && break
        sleep 0.1
    done
    [ "$held" = 1 ]; expect "a session holds m-5" $?
    psql -qX -d app -c "SELECT idem_claim('m-5', idem_hash('{}'::jsonb))" >/dev/null

    DATA_SOURCE_NAME="host=$cluster port=$port user=prometheus dbname=app sslmode=disable" \
        prometheus-postgres-exporter --extend.query-path="$here/queries.yaml" \
        --web.listen-address="127.0.0.1:$web_port" --log.level=warn \
        >"$work/exporter.log" 2>&1 &
    exporter_pid=$!
    local tries=0
    until curl -sf "http://127.0.0.1:$web_port/metrics" >"$work/metrics" 2>/dev/null; do
        tries=$((tries + 1))
        [ $tries -gt 100 ] && { echo "the exporter did not answer"; cat "$work/exporter.log"; return 1; }
        sleep 0.1
    done
    grep '^idem' "$work/metrics"

    # Every series queries.yaml defines (PREFIX_COLUMN for every column but the labels), with HELP and TYPE.
    while read -r name type help; do
        grep -Eq "^$name(\{| )" "$work/metrics"; expect "series $name is scraped" $?
        grep -Fq "# HELP $name $help" "$work/metrics"; expect "HELP of $name" $?
        grep -Fxq "# TYPE $name $type" "$work/metrics"; expect "TYPE of $name is $type" $?
        case $name in
            *_total) [ "$type" = counter ]; expect "$name ends in _total and is a counter" $? ;;
            *) [ "$type" = gauge ]; expect "$name is a gauge" $? ;;
        esac
    done < <(python3 - "$here/queries.yaml" <<'EOF'
import sys, yaml
for prefix, q in yaml.safe_load(open(sys.argv[1])).items():
    for m in q["metrics"]:
        (col, spec), = m.items()
        if spec["usage"] != "LABEL":
            print(f"{prefix}_{col}", spec["usage"].lower(), spec["description"])
EOF
    )

    # Every column of idem_stats is in the exporter's query: a counter added to the view must be added there too.
    for col in $(psql -qXAt -d app -c "SELECT attname FROM pg_attribute WHERE attrelid = 'idem_stats'::regclass AND attnum > 0 ORDER BY attnum"); do
        python3 - "$here/queries.yaml" "$col" <<'EOF'
import re, sys, yaml
queries = yaml.safe_load(open(sys.argv[1]))
sql = queries["idem"]["query"] + queries["idem_sweep"]["query"]
sys.exit(0 if re.search(r"\b%s\b" % re.escape(sys.argv[2]), sql) else 1)
EOF
        expect "idem_stats.$col is exposed" $?
    done

    # The values are the server's: counters as idem_stats has them, the key in flight, the expired key, the launcher.
    for col in claims replays in_progress mismatches completions_stored released_5xx leases checkpoints; do
        want=$(psql -qXAt -d app -c "SELECT $col FROM idem_stats")
        value=$(awk -v n="idem_${col}_total" '$1 ~ "^"n"({|$)" {print $2}' "$work/metrics")
        [ -n "$value" ] && [ "$(printf '%.0f' "$value")" = "$want" ]; expect "idem_${col}_total = $want (got '$value')" $?
    done
    grep -Eq '^idem_counters_shared(\{[^}]*\})? 1$' "$work/metrics"; expect "idem_counters_shared is 1" $?
    grep -Eq '^idem_launcher_running(\{[^}]*\})? 1$' "$work/metrics"; expect "idem_launcher_running is 1" $?
    grep -Eq '^idem_in_flight_keys\{[^}]*holder="transaction"[^}]*\} 1$' "$work/metrics"; expect "one transaction key in flight" $?
    grep -Eq '^idem_in_flight_keys\{[^}]*holder="lease"[^}]*\} 1$' "$work/metrics"; expect "one lease in flight" $?
    grep -Eq '^idem_storage_expired_keys\{[^}]*table="idempotency_keys"[^}]*\} 1$' "$work/metrics"; expect "one expired key" $?
    want=$(psql -qXAt -d app -c "SELECT count(*) FROM idem_partitions()")
    grep -Eq "^idem_storage_partitions\{[^}]*table=\"idempotency_keys_partitioned\"[^}]*\} $want\$" "$work/metrics"
    expect "idem_storage_partitions = idem_partitions() ($want)" $?
    grep -Eq '^pg_exporter_last_scrape_error(\{[^}]*\})? 0$' "$work/metrics"; expect "the exporter's last scrape had no error" $?
    ! grep -Ei 'error|level=warn' "$work/exporter.log"; expect "the exporter logged no failed query" $?
    grep -Eq '^pg_exporter_user_queries_load_error\{[^}]*\} 0$' "$work/metrics"; expect "queries.yaml loaded" $?

    echo "ROLLBACK;" >&"${HOLDER[1]}"
    exec {HOLDER[1]}>&-
    wait "$HOLDER_PID"
    unset PGHOST PGPORT PGUSER
    count metrics-scrape "$ok" "$bad"
}
scrape || count metrics-scrape 0 1

cat "$log_dir/summary"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
