#!/usr/bin/env bash
# The extension on a Citus cluster: PostgreSQL 17 (scripts/build-pg.sh) with Citus 14.0.1 (scripts/build-citus.sh),
# a coordinator and two workers on loopback, ports 56110-56112 (IDEM_CITUS_PORT moves the base, 56110),
# shared_preload_libraries = 'citus,idempotency', wal_level = logical (for shard moves by logical replication).
# Run as root. Prints one line per suite, "<suite> N passed, N failed", then the total "N passed, N failed":
#   citus-build      the builds (extension with zero warnings)
#   citus-layout     each unsupported layout refused with its message, then idem_citus_distribute
#   citus-semantics  new key, replay, mismatch, in_progress, rollback, 5xx, scopes, lease takeover, a delegated
#                    post_payment, from every node; a call that was not delegated is refused
#   citus-ops        the sweeper on every node, idem_keys_in_flight() and idem_citus_stats() on the coordinator
#   citus-load       8 clients over the three nodes, 2,000 payments with retries, a worker killed (-9) and restarted
#   citus-move       a claim held while its shard moves (the move waits for it, its row moves); 8 clients paying
#                    to busy tenants with retries while their shards move between the workers (block_writes and
#                    force_logical); a lease's fencing numbers keep increasing across the moves
# Without the Citus tarball (scripts/build-citus.sh) it prints "citus SKIPPED: <reason>" and exits 3.
# IDEM_CITUS_LOAD_KEYS (2000) and IDEM_CITUS_LOAD_CLIENTS (8) size the load.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
prefix=${IDEM_PG_ROOT:-/opt/idem-pg}/17
PG_BIN=$prefix/bin
source scripts/lib/cluster.sh

log_dir=$(mktemp -d /tmp/idem-citus-logs.XXXXXX)
chmod 755 "$log_dir"
COUNT_FORMAT='%s %d passed, %d failed\n'
source scripts/lib/count.sh

work=$(mktemp -d /tmp/idem-citus.XXXXXX)
chmod 755 "$work"
nodes=(coordinator worker1 worker2)
base_port=${IDEM_CITUS_PORT:-56110}
declare -A port=([coordinator]=$base_port [worker1]=$((base_port + 1)) [worker2]=$((base_port + 2)))
holders=()
cleanup() {
    for pid in "${holders[@]}"; do kill "$pid" 2>/dev/null; done
    for n in "${nodes[@]}"; do stop_cluster "$work/$n"; done
    rm -rf "$work" "$log_dir"
}
trap cleanup EXIT

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

# ---------- the cluster ----------
q() {  # q NODE [psql args...]: one psql as postgres in database app of NODE, stops at the first error
    local node=$1
    shift
    "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "${port[$node]}" -U postgres -d app -v ON_ERROR_STOP=1 "$@"
}
for n in "${nodes[@]}"; do
    start_cluster "$work/$n" "${port[$n]}" "shared_preload_libraries = 'citus,idempotency'" \
        "max_prepared_transactions = 100" "max_connections = 200" "idempotency.databases = 'app'" \
        "idempotency.cleanup_interval = 1" "citus.shard_replication_factor = 1" \
        "log_min_messages = warning" "wal_level = logical"
    "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "${port[$n]}" -U postgres -d postgres -c "CREATE DATABASE app"
    q "$n" -c "CREATE EXTENSION citus"
done
q coordinator -c "SELECT citus_set_coordinator_host('127.0.0.1', ${port[coordinator]})" \
    -c "SELECT citus_add_node('127.0.0.1', ${port[worker1]})" \
    -c "SELECT citus_add_node('127.0.0.1', ${port[worker2]})" >/dev/null
# Citus propagates CREATE and ALTER EXTENSION to the workers.
q coordinator -c "CREATE EXTENSION idempotency"
if [ "$(q coordinator -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" != 1.3 ]; then
    q coordinator -c "ALTER EXTENSION idempotency UPDATE TO '1.3'"
fi

# ---------- checks ----------
suite=
declare -A ok bad
check() {  # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then
        ok[$suite]=$(( ${ok[$suite]:-0} + 1 ))
        echo "ok - $suite: $1"
    else
        bad[$suite]=$(( ${bad[$suite]:-0} + 1 ))
        echo "not ok - $suite: $1: expected '$2', got '$3'"
    fi
}
check_error() {  # check_error NAME PATTERN NODE SQL: the statement fails with a message matching PATTERN
    local out
    if out=$(q "$3" -c "$4" 2>&1); then
        check "$1" "an error matching '$2'" "success: $out"
    elif tr "\n" " " <<<"$out" | grep -Eq "$2"; then
        check "$1" ok ok
    else
        check "$1" "an error matching '$2'" "$out"
    fi
}
end_suite() {
    count "$suite" "${ok[$suite]:-0}" "${bad[$suite]:-0}"
    # Not in the "<suite> N passed, N failed" form: scripts/test.sh counts those lines, and the summary at the
    # end prints each suite once.
    echo "== $suite: ${ok[$suite]:-0} passed, ${bad[$suite]:-0} failed"
}
hash_of() { echo "idem_hash('$1'::text)"; }

# ---------- unsupported layouts ----------
suite=citus-layout
# Keys stored before the layout exists: one unscoped, one of acct-1 (both local on the coordinator for now).
q coordinator -c "BEGIN" -c "SELECT outcome FROM idem_claim('pre-unscoped', $(hash_of a))" \
    -c "SELECT idem_complete('pre-unscoped', 201, '{\"pre\": 1}')" -c "COMMIT" >/dev/null
q coordinator -c "BEGIN" -c "SELECT outcome FROM idem_claim('pre-1', $(hash_of a), NULL, 'acct-1')" \
    -c "SELECT idem_complete('pre-1', 201, '{\"pre\": 1}', NULL, 'acct-1')" -c "COMMIT" >/dev/null
check_error "without distributed tables: idem_citus_distribute of a local table" "is not distributed by Citus" \
    coordinator "CREATE TABLE plain_local (tenant text COLLATE \"C\"); SELECT idem_citus_distribute('plain_local')"
q coordinator -c "SELECT idem_set_storage('partitioned', '1 hour')" >/dev/null
check_error "partitioned storage refused" "partitioned storage is not supported on Citus" coordinator \
    "CREATE TABLE t0 (tenant text COLLATE \"C\"); SELECT create_distributed_table('t0', 'tenant');
     SELECT idem_citus_distribute('t0')"
q coordinator -c "SELECT idem_set_storage('table')" >/dev/null
q coordinator -f test/citus/schema.sql -f test/citus/distribute.sql >/dev/null
check_error "keys local on the coordinator beside distributed tables: a claim refuses" \
    "idempotency_keys is local on this node while Citus distributes other tables" coordinator \
    "SELECT outcome FROM idem_claim('local-1', $(hash_of a), NULL, 'acct-1')"
q coordinator -c "CREATE TABLE by_number (tenant bigint); SELECT create_distributed_table('by_number', 'tenant')" \
    -c "CREATE TABLE by_default_collation (tenant text); SELECT create_distributed_table('by_default_collation', 'tenant')" \
    -c "CREATE TABLE currencies (code text COLLATE \"C\" PRIMARY KEY); SELECT create_reference_table('currencies')" \
    >/dev/null
check_error "a bigint tenant column: refused with the fix" \
    'by_number.tenant is bigint COLLATE none.*HINT:.*ALTER TABLE (public.)?by_number ALTER COLUMN tenant TYPE text COLLATE "C"' \
    coordinator "SELECT idem_citus_distribute('by_number')"
check_error "a text tenant column of another collation: refused" \
    'by_default_collation.tenant is text COLLATE "default"' coordinator \
    "SELECT idem_citus_distribute('by_default_collation')"
check_error "a reference table: refused" "currencies is a reference table" coordinator \
    "SELECT idem_citus_distribute('currencies')"
check_error "idem_citus_distribute on a worker: refused" "must run on the Citus coordinator" worker1 \
    "SELECT idem_citus_distribute('accounts')"
out=$(q coordinator -c "SELECT idem_citus_distribute('accounts')" 2>&1)
echo "$out"
check "idem_citus_distribute('accounts')" 1 "$(grep -Ec 'distributed by scope, co-located with (public.)?accounts; 9 functions delegated' <<<"$out")"
check "unscoped keys: warned" 1 "$(grep -c 'WARNING:  idem_citus_distribute: 1 stored keys have no scope; all unscoped keys land on one shard' <<<"$out")"
check "the keys' shards are co-located with the accounts'" t \
    "$(q coordinator -c "SELECT (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass)
                             = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'accounts'::regclass)")"
check "the coordinator's shell is empty after distributing" 0 \
    "$(q coordinator -c "SELECT pg_relation_size('idempotency_keys')")"
check "a second call changes nothing" 1 \
    "$(q coordinator -c "SELECT idem_citus_distribute('accounts')" 2>&1 | grep -c '9 functions delegated')"
check_error "undistributing the keys: refused" "extension" coordinator \
    "SELECT undistribute_table('idempotency_keys')"
check_error "partitioned storage after distributing: refused by idem_set_storage" \
    "partitioned storage is not supported for keys distributed by Citus" coordinator \
    "SELECT idem_set_storage('partitioned')"
check_error "another co-location afterwards: refused" "already in Citus's metadata, not co-located with (public.)?other_tenants" \
    coordinator "CREATE TABLE other_tenants (tenant text COLLATE \"C\");
                 SELECT create_distributed_table('other_tenants', 'tenant', colocate_with => 'none');
                 SELECT idem_citus_distribute('other_tenants')"
end_suite

# ---------- semantics from every node ----------
suite=citus-semantics
# Two accounts, one on each worker.
worker_of() {  # worker_of ACCOUNT: the node holding its shard
    local p
    p=$(q coordinator -c "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                          WHERE p.shardid = get_shard_id_for_distribution_column('accounts', '$1')")
    for n in "${nodes[@]}"; do [ "${port[$n]}" = "$p" ] && echo "$n"; done
}
declare -A account_on
for i in $(seq 1 40); do
    w=$(worker_of "acct-$i")
    [ -z "${account_on[$w]:-}" ] && account_on[$w]=acct-$i
    [ -n "${account_on[worker1]:-}" ] && [ -n "${account_on[worker2]:-}" ] && break
done
a1=${account_on[worker1]}
a2=${account_on[worker2]}
echo "accounts: $a1 on worker1, $a2 on worker2"

check "a key stored before distributing replays after it" "replay|201" \
    "$(q worker2 -c "SELECT outcome || '|' || http_status FROM idem_claim('pre-1', $(hash_of a), NULL, 'acct-1')")"
q coordinator -c "DELETE FROM idempotency_keys WHERE key = 'pre-1' AND scope = 'acct-1'" >/dev/null
check "deleted through Citus, it is gone" claimed \
    "$(q coordinator -c "SELECT outcome FROM idem_claim('pre-1', $(hash_of a), NULL, 'acct-1')")"

for from in "${nodes[@]}"; do
    for account in "$a1" "$a2"; do
        key=k-$from-$account
        check "$from, $account: new key" claimed \
            "$(q "$from" -c "BEGIN" -c "SELECT outcome FROM idem_claim('$key', $(hash_of a), NULL, '$account')" \
                 -c "SELECT idem_complete('$key', 201, '{\"id\": 1}', NULL, '$account')" -c "COMMIT" | sed -n 1p)"
        for again in "${nodes[@]}"; do
            check "$from, $account: replay from $again" 'replay|201|{"id": 1}' \
                "$(q "$again" -c "SELECT outcome || '|' || http_status || '|' || response_body
                                  FROM idem_claim('$key', $(hash_of a), NULL, '$account')")"
        done
        check "$from, $account: mismatch" "mismatch|422" \
            "$(q "$from" -c "SELECT outcome || '|' || http_status FROM idem_claim('$key', $(hash_of b), NULL, '$account')")"
        check "$from, $account: 5xx not stored" "claimed|f|claimed" \
            "$(q "$from" -c "BEGIN" -c "SELECT outcome FROM idem_claim('5xx-$key', $(hash_of a), NULL, '$account')" \
                 -c "SELECT idem_complete('5xx-$key', 503, NULL, NULL, '$account')" -c "COMMIT" \
                 -c "SELECT outcome FROM idem_claim('5xx-$key', $(hash_of a), NULL, '$account')" | paste -sd'|')"
        check "$from, $account: rollback frees the key" "claimed|claimed" \
            "$(q "$from" -c "BEGIN" -c "SELECT outcome FROM idem_claim('rb-$key', $(hash_of a), NULL, '$account')" \
                 -c "ROLLBACK" -c "SELECT outcome FROM idem_claim('rb-$key', $(hash_of a), NULL, '$account')" | paste -sd'|')"
    done
done

# One key in two scopes on two workers is two keys.
q coordinator -c "BEGIN" -c "SELECT outcome FROM idem_claim('shared-key', $(hash_of a), NULL, '$a1')" \
    -c "SELECT idem_complete('shared-key', 201, '{\"scope\": 1}', NULL, '$a1')" -c "COMMIT" >/dev/null
check "one key, two scopes on two workers: two keys" "replay|claimed" \
    "$(q coordinator -c "SELECT outcome FROM idem_claim('shared-key', $(hash_of a), NULL, '$a1')" \
         -c "SELECT outcome FROM idem_claim('shared-key', $(hash_of b), NULL, '$a2')" | paste -sd'|')"

# Bound parameters (extended protocol, as drivers send them) are delegated too: Citus plans the call for the value.
h=$(q coordinator -c "SELECT idem_hash('a'::text)")
for from in coordinator worker2; do
    check "bound parameters from $from: claim and completion in a transaction, then a replay" "claimed|t|replay" \
        "$(printf '%s\n' 'BEGIN;' "SELECT outcome FROM idem_claim(\$1, \$2, NULL, \$3) \\bind bp-$from $h $a1 \\g" \
              "SELECT idem_complete(\$1, 201, NULL, NULL, \$2) \\bind bp-$from $a1 \\g" 'COMMIT;' \
              "SELECT outcome FROM idem_claim(\$1, \$2, NULL, \$3) \\bind bp-$from $h $a1 \\g" | q "$from" | paste -sd'|')"
done

# in_progress at once from every node while a transaction on the owner holds the key; the holder then rolls back.
for holder_node in coordinator worker1; do
    key=held-$holder_node
    q "$holder_node" -c "BEGIN" -c "SELECT outcome FROM idem_claim('$key', $(hash_of a), NULL, '$a2')" \
        -c "SELECT pg_sleep(8)" -c "ROLLBACK" >"$log_dir/holder.log" 2>&1 &
    holders+=($!)
    for _ in $(seq 50); do
        [ "$(q worker2 -c "SELECT count(*) FROM idem_keys_in_flight_claims() WHERE key = '$key'")" = 1 ] && break
        sleep 0.1
    done
    for from in "${nodes[@]}"; do
        started=$(date +%s%N)
        outcome=$(q "$from" -c "SELECT outcome || '|' || http_status FROM idem_claim('$key', $(hash_of a), NULL, '$a2')")
        ms=$(( ($(date +%s%N) - started) / 1000000 ))
        check "held through $holder_node: in_progress from $from" "in_progress|409" "$outcome"
        # At once: far below the holder's 8 s, with room for two busy cores.
        check "held through $holder_node: answered from $from in under 3 s" yes "$([ "$ms" -lt 3000 ] && echo yes || echo "no: $ms ms")"
    done
    if [ "$holder_node" = coordinator ]; then
        suite=citus-ops
        check "idem_keys_in_flight() on the coordinator lists the claim held on worker2" "$key|transaction@127.0.0.1:${port[worker2]}" \
            "$(q coordinator -c "SELECT key || '|' || holder FROM idem_keys_in_flight() WHERE key = '$key'")"
        suite=citus-semantics
    fi
    wait "${holders[-1]}"
    check "held through $holder_node: after its rollback the key is free" claimed \
        "$(q worker1 -c "SELECT outcome FROM idem_claim('$key', $(hash_of a), NULL, '$a2')")"
done

# A call that Citus does not delegate (a PL/pgSQL simple expression) runs where it is and is refused there.
check_error "not delegated, on the coordinator: refused" "the key's shard is not on this node" coordinator \
    "DO \$\$ BEGIN PERFORM idem_claim('nd-1', idem_hash('a'::text), NULL, '$a1'); END \$\$"
check_error "not delegated, on the other worker: refused" "Scope \"$a1\" lives in shard [0-9]+ of idempotency_keys, on 127.0.0.1:${port[worker1]}" worker2 \
    "DO \$\$ BEGIN PERFORM idem_claim('nd-1', idem_hash('a'::text), NULL, '$a1'); END \$\$"
check "not delegated, on the owner itself: served" claimed \
    "$(q worker1 -c "DO \$\$ BEGIN PERFORM idem_claim('nd-1', idem_hash('a'::text), NULL, '$a1'); END \$\$" -c "SELECT 'claimed'")"

# Lease mode with a takeover, from the coordinator and a worker.
for from in coordinator worker2; do
    key=lease-$from
    # A 5-second lease: the two calls below fit in it with both cores busy; then wait until it has run out.
    read -r token until < <(q "$from" -F ' ' -c "SELECT lease_token, lease_until FROM idem_lease('$key', $(hash_of a), '5 seconds', NULL, '$a1')")
    check "$from: lease granted" 36 "${#token}"
    q "$from" -c "SELECT idem_checkpoint('$key', '$token', 'charged', '{\"charge\": \"ch_1\"}', '$a1')" >/dev/null
    check "$from: lease in_progress while it runs" in_progress \
        "$(q worker1 -c "SELECT outcome FROM idem_lease('$key', $(hash_of a), '1 second', NULL, '$a1')")"
    q "$from" -c "SELECT pg_sleep(greatest(0, extract(epoch FROM '$until'::timestamptz - clock_timestamp()) + 0.2))" >/dev/null
    check "$from: takeover after the lease ran out resumes at the recovery point" 'claimed|charged|{"charge": "ch_1"}' \
        "$(q worker2 -c "SELECT outcome || '|' || recovery_point || '|' || recovery_state
                         FROM idem_lease('$key', $(hash_of a), '30 seconds', NULL, '$a1')")"
    check_error "$from: the stale holder is fenced" "55000|lease" "$from" \
        "SELECT idem_lease_complete('$key', '$token', 201, NULL, NULL, '$a1')"
done

# post_payment: claim, debit and completion in one delegated transaction, from every node.
for from in "${nodes[@]}"; do
    for account in "$a1" "$a2"; do
        key=pay-$from-$account
        check "$from, $account: post_payment" claimed \
            "$(q "$from" -c "SELECT post_payment('$account', '$key', 7)->>'outcome'")"
        check "$from, $account: post_payment retried: replay" 'replay|{"debited": 7}' \
            "$(q "$from" -c "SELECT (p->>'outcome') || '|' || (p->'body')::text FROM post_payment('$account', '$key', 7) p")"
        check "$from, $account: post_payment inside a transaction block" claimed \
            "$(q "$from" -c "BEGIN" -c "SELECT post_payment('$account', 'tx-$key', 3)->>'outcome'" -c "COMMIT")"
    done
done
check "each payment debited once" "0|12" \
    "$(q coordinator -c "SELECT (SELECT count(*) FROM (SELECT 1 FROM ledger GROUP BY account, payment_key HAVING count(*) > 1) d)
                         || '|' || (SELECT count(*) FROM ledger)")"
check "balances match the ledger" 0 \
    "$(q coordinator -c "SELECT count(*) FROM accounts a WHERE a.balance <> 1000000 - coalesce((SELECT sum(amount) FROM ledger l WHERE l.account = a.account), 0)")"
end_suite

# ---------- operations ----------
suite=citus-ops
# Keys with a 1-second ttl in scopes on both workers; the sweepers remove them.
for i in $(seq 1 20); do
    echo "BEGIN; SELECT outcome FROM idem_claim('short-$i', idem_hash('a'::text), '1 second', 'acct-$i');"
    echo "SELECT idem_complete('short-$i', 201, NULL, NULL, 'acct-$i'); COMMIT;"
done | q coordinator >/dev/null
check "20 short-lived keys stored on both workers" 20 \
    "$(q coordinator -c "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'short-%'")"
for _ in $(seq 60); do
    [ "$(q coordinator -c "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'short-%'")" = 0 ] && break
    sleep 0.5
done
check "the sweepers removed them" 0 "$(q coordinator -c "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'short-%'")"
for n in worker1 worker2; do
    check "$n: its sweeper removed keys of its shards" t "$(q "$n" -c "SELECT keys_removed > 0 FROM idem_stats")"
    check "$n: no sweep error" "" "$(q "$n" -c "SELECT last_error FROM idem_stats")"
done
check "the coordinator's sweeper has nothing to remove and no error" "0|" \
    "$(q coordinator -c "SELECT keys_removed || '|' || coalesce(last_error, '') FROM idem_stats")"
check "no node logged a failing sweep" 0 \
    "$(cat "$work"/*/server.log | grep -c 'cannot perform distributed planning\|idempotency.*ERROR\|ERROR.*expired keys')"
check "idem_citus_stats() on the coordinator: one row per node" 3 "$(q coordinator -c "SELECT count(*) FROM idem_citus_stats()")"
check "idem_citus_stats(): the workers' claims add up" t \
    "$(q coordinator -c "SELECT sum((stats->>'claims')::bigint) >= 60 FROM idem_citus_stats()")"
end_suite

# ---------- load with a worker killed ----------
suite=citus-load
if perl test/citus/load.pl --ports "${port[coordinator]},${port[worker1]},${port[worker2]}" \
        --keys "${IDEM_CITUS_LOAD_KEYS:-2000}" --clients "${IDEM_CITUS_LOAD_CLIENTS:-8}" \
        --kill-data "$work/worker2/data" --pg-bin "$PG_BIN" --log "$work/worker2/server.log" \
        >"$log_dir/load.log" 2>&1; then
    :
fi
cat "$log_dir/load.log"
while read -r name expected actual; do
    check "$name" "$expected" "$actual"
done < <(grep '^CHECK ' "$log_dir/load.log" | cut -d' ' -f2-)
grep -q '^CHECK ' "$log_dir/load.log" || check "the load test ran" yes no
end_suite

# ---------- shard moves under load ----------
suite=citus-move
# A claim held while its shard is moved: the claim holds Citus's shard metadata lock (the direct path takes it at
# the claim's lookup), so the move waits for the claim's transaction and then moves its completed row.
owner=$(worker_of "$a1")
other=worker1
[ "$owner" = worker1 ] && other=worker2
shard=$(q coordinator -c "SELECT get_shard_id_for_distribution_column('idempotency_keys', '$a1')")
q "$owner" -c "BEGIN" -c "SELECT outcome FROM idem_claim('moved-held', $(hash_of a), NULL, '$a1')" \
    -c "SELECT pg_sleep(10)" -c "SELECT idem_complete('moved-held', 201, '{\"held\": 1}', NULL, '$a1')" -c "COMMIT" \
    >"$log_dir/held-move.log" 2>&1 &
holders+=($!)
for _ in $(seq 50); do
    [ "$(q "$owner" -c "SELECT count(*) FROM idem_keys_in_flight_claims() WHERE key = 'moved-held'")" = 1 ] && break
    sleep 0.1
done
check "a held claim holds Citus's shard metadata lock" 1 \
    "$(q "$owner" -c "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                      WHERE l.locktype = 'advisory' AND l.objsubid = 8 AND l.mode = 'ShareLock' AND l.granted
                        AND a.query LIKE '%pg_sleep(10)%'")"
q coordinator -c "SELECT citus_move_shard_placement($shard, '127.0.0.1', ${port[$owner]}, '127.0.0.1', ${port[$other]},
                                                    'block_writes')" >"$log_dir/move-held.log" 2>&1 &
mover=$!
waiting=no
# Within the holder's 10 s, with room for a slow start of the move on two busy cores.
for _ in $(seq 80); do
    if [ "$(q "$owner" -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 8
                           AND mode = 'ExclusiveLock' AND NOT granted")" -ge 1 ]; then
        waiting=yes
        break
    fi
    sleep 0.1
done
check "the move waits for the claim's transaction" yes "$waiting"
wait "${holders[-1]}"
wait "$mover"
cat "$log_dir/move-held.log"
check "after the move the shard is on $other" "$other" "$(worker_of "$a1")"
for from in "${nodes[@]}"; do
    check "the claim completed during the move replays from $from" 'replay|201|{"held": 1}' \
        "$(q "$from" -c "SELECT outcome || '|' || http_status || '|' || response_body
                         FROM idem_claim('moved-held', $(hash_of a), NULL, '$a1')")"
done

# The shards of two busy tenants (one on each worker; keys, accounts and ledger move together), moved to the other
# worker and back while 8 clients pay to those tenants with retries. Logical replication needs a replica identity
# on every co-located table: the ledger has no primary key.
q coordinator -c "ALTER TABLE ledger REPLICA IDENTITY FULL" >/dev/null
if perl test/citus/load.pl --ports "${port[coordinator]},${port[worker1]},${port[worker2]}" --prefix move \
        --keys "${IDEM_CITUS_MOVE_KEYS:-600}" --clients "${IDEM_CITUS_LOAD_CLIENTS:-8}" --move "$a1,$a2" \
        --move-rounds 2 --move-modes block_writes,force_logical >"$log_dir/move.log" 2>&1; then
    :
fi
cat "$log_dir/move.log"
while read -r name expected actual; do
    check "$name" "$expected" "$actual"
done < <(grep '^CHECK ' "$log_dir/move.log" | cut -d' ' -f2-)
grep -q '^CHECK ' "$log_dir/move.log" || check "the move test ran" yes no
check "no node logged a crash" 0 "$(cat "$work"/*/server.log | grep -c 'terminated by signal')"
end_suite

finish
