#!/usr/bin/env bash
# Instructions per request, counted by callgrind in a single-user backend: repeatable on a noisy machine where
# throughput is not. Each request is what the pgbench scripts send (prepared statements, one transaction per
# request); the count is (run of N requests - run of 0 requests) / N, so start-up and shutdown cancel out.
# Client round trips and socket I/O are not counted: this measures the backend's own work.
#
#   bench/instructions.sh                 all variants of "new" and "replay", N=2000
#   INSTR_N=500 INSTR_CASES="new_floor new_extension" INSTR_KEEP=1 bench/instructions.sh
#   INSTR_CASES="new_partitioned replay_partitioned" bench/instructions.sh   new_extension's and replay_extension's
#       statements against a database in partitioned storage (1 hour partitions), not in the default list
#   INSTR_CASES="lease_floor lease_extension" bench/instructions.sh   lease mode (1.1), not in the default list:
#       two transactions per request as bench/lease/*.sql; the token goes from the first to the second through
#       set_config (pgbench's \gset), the same in both cases
#   INSTR_CASES="client_bare client_guard client_bare_prep client_guard_prep client_guard_hashed" bench/instructions.sh
#       what the client middleware's requests cost the server (issue 25, item 4; not in the default list): the bare
#       transactional handler (BEGIN, INSERT ... RETURNING, COMMIT) against the middleware's statements as the Go,
#       Node and Python clients send them (claim with the request fingerprint built by idem_hash, the handler's
#       INSERT, idem_complete returning jsonb's text of the body); *_prep with prepared statements (pgx's statement
#       cache), the others parsed and planned per request (node-postgres's unnamed statements, psycopg's
#       ClientCursor); client_guard_hashed passes a precomputed hash instead of building the fingerprint
#   INSTR_CASES="client_bare_prep client13_prep client13" bench/instructions.sh
#       the same with the statements of 1.3 as the Go client sends them (clients/go/idempotency.go): idem_claim_request
#       and idem_complete_request, prepared (pgx's statement cache), and as the simple protocol sends them through
#       PgBouncer (the text with the values in it, parsed and planned per request)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh

n=${INSTR_N:-2000}
cases=${INSTR_CASES:-new_bare new_floor new_plpgsql new_extension proc_floor proc_plpgsql proc_extension replay_floor replay_plpgsql replay_extension}
port=${INSTR_PORT:-55434}
dir=$(mktemp -d /tmp/idem-instr.XXXXXX)
# INSTR_KEEP=1 keeps the callgrind files in $dir for callgrind_annotate.
[ "${INSTR_KEEP:-0}" = 1 ] || trap 'stop_cluster "$dir"' EXIT

kp=bench-key-000000-
body='{"payment_id":"pay_7Hk2N9xQ4mB8vR1s","status":"succeeded","amount_cents":1999,"currency":"EUR","captured":true}'
first_key=1000000000000000001

make -s >/dev/null && make -s install >/dev/null
start_cluster "$dir" "$port" "shared_preload_libraries = 'idempotency'"
q() { psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d bench "$@"; }
psql -X -q -h "$dir" -p "$port" -U postgres -d postgres -c "CREATE DATABASE bench"
q -c "CREATE EXTENSION idempotency" -f bench/plpgsql_baseline.sql -f bench/setup.sql >/dev/null
h=$(q -At -c "SELECT idem_hash('$body'::jsonb)")
for api in extension plpgsql; do
    q -c "CALL bench.load_keys('$api', '$kp', $first_key, 20000, '$h', '$body')"
done
# The *_partitioned cases send new_extension's and replay_extension's statements to a database in partitioned
# storage, where claims are planned per call (custom plans, so that expired partitions are pruned at plan time).
if [[ " $cases " == *"_partitioned "* ]]; then
    psql -X -q -h "$dir" -p "$port" -U postgres -d postgres -c "CREATE DATABASE bench_partitioned"
    psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d bench_partitioned \
        -c "CREATE EXTENSION idempotency" -f bench/setup.sql \
        -c "SELECT public.idem_set_storage('partitioned', interval '1 hour')" \
        -c "CALL bench.load_keys('extension', '$kp', $first_key, 20000, '$h', '$body')" -c "VACUUM ANALYZE" >/dev/null
fi
if [[ " $cases " == *" lease_"* ]]; then
    q -f bench/lease/setup.sql -c "CALL bench.load_floor_keys('$kp', $first_key, 20000, '$h', '$body')"
fi
q -c "VACUUM ANALYZE"
cluster_ctl "$dir" stop

# The clients' statements (clients/go/idempotency.go claimSQL/completeSQL; Node and Python send the same).
req='{"account":"acct-1","amount_cents":500,"currency":"EUR"}'
headers='{"Content-Type":"application/json"}'
client_insert='INSERT INTO bench.ledger (account_id, amount_cents) VALUES ($1, $2) RETURNING id'
client_claim() {  # client_claim KEY METHOD PATH BODY TTL SCOPE (SQL expressions)
    echo "SELECT c.outcome, c.http_status, c.response_body::text, c.response_headers::text FROM public.idem_claim($1::text, public.idem_hash(jsonb_build_object('method', $2::text, 'path', $3::text, 'body', $4::jsonb)), $5::interval, $6::text) AS c"
}
hex() { printf '%s' "$1" | od -An -tx1 | tr -d ' \n'; }
req13="'\\x$(hex "$req")'" body13="'\\x$(hex "$body")'" loc13="'{\"Location\": \"/payments/1\"}'"
client_complete() {  # client_complete KEY STATUS BODY HEADERS SCOPE
    echo "SELECT public.idem_complete($1::text, $2::int, r.b, $4::jsonb, $5::text), r.b::text FROM (SELECT $3::jsonb AS b) AS r"
}

# The statements of one variant: PREPARE once, then N requests of EXECUTEs.
statements() {  # statements CASE COUNT
    local c=$1 count=$2 api claim complete
    case $c in
        *_plpgsql) api=plpgsql_idem ;;
        *) api=public ;;
    esac
    echo "SET synchronous_commit = off"
    case $c in
        new_bare) ;;
        new_floor)
            echo "PREPARE c(text, text) AS SELECT \$1, \$2"
            echo "PREPARE d(text, int, text) AS SELECT \$1, \$2, \$3" ;;
        new_*)
            echo "PREPARE c(text, text) AS SELECT * FROM $api.idem_claim(\$1, \$2)"
            echo "PREPARE d(text, int, jsonb) AS SELECT $api.idem_complete(\$1, \$2, \$3)" ;;
        proc_*) echo "PREPARE p(text, text, int, bigint, jsonb) AS SELECT bench.request_${c#proc_}(\$1, \$2, \$3, \$4, \$5)" ;;
        replay_floor) echo "PREPARE c(text, text) AS SELECT \$1, \$2" ;;
        lease_extension)
            echo "PREPARE a(text, text) AS SELECT set_config('bench.token', lease_token::text, false) FROM public.idem_lease(\$1, \$2, '30 s')"
            echo "PREPARE b(text, int, jsonb) AS SELECT public.idem_lease_complete(\$1, current_setting('bench.token')::uuid, \$2, \$3)" ;;
        lease_floor)
            echo "PREPARE a(text, text) AS INSERT INTO bench.lease_floor (expires_at, created_at, scope, key, request_hash, lease_until, lease_token) VALUES (now() + '24 h', now(), '', \$1, decode(\$2, 'hex'), clock_timestamp() + '30 s', gen_random_uuid()) RETURNING set_config('bench.token', lease_token::text, false)"
            echo "PREPARE b(text, int, jsonb) AS UPDATE bench.lease_floor SET http_status = \$2, response_body = \$3, response_headers = NULL, lease_until = NULL, lease_token = NULL WHERE scope = '' AND key = \$1 AND lease_token = current_setting('bench.token')::uuid AND http_status IS NULL" ;;
        replay_*) echo "PREPARE c(text, text) AS SELECT * FROM $api.idem_claim(\$1, \$2)" ;;
        client_bare_prep) echo "PREPARE l2(int, bigint) AS $client_insert" ;;
        client_guard_prep)
            echo "PREPARE l2(int, bigint) AS $client_insert"
            echo "PREPARE c2(text, text, text, text, interval, text) AS $(client_claim '$1' '$2' '$3' '$4' '$5' '$6')"
            echo "PREPARE d2(text, int, text, text, text) AS $(client_complete '$1' '$2' '$3' '$4' '$5')" ;;
        client13_prep)
            echo "PREPARE l2(int, bigint) AS $client_insert"
            echo "PREPARE c3 AS SELECT idem_claim_request(\$1, \$2, \$3, \$4, \$5, \$6, \$7, \$8)"
            echo "PREPARE d3 AS SELECT idem_complete_request(\$1, \$2, \$3, \$4, \$5, \$6)" ;;
    esac
    echo "PREPARE l(int, bigint) AS INSERT INTO bench.ledger (account_id, amount_cents) VALUES (\$1, \$2)"
    for ((i = 0; i < count; i++)); do
        key="$kp$((2000000000000000000 + RANDOM * 32768 + RANDOM))$i"
        case $c in
            new_bare) echo "BEGIN"; echo "EXECUTE l($((i % 1000)), $i)"; echo "COMMIT" ;;
            new_*)
                echo "BEGIN"; echo "EXECUTE c('$key', '$h')"; echo "EXECUTE l($((i % 1000)), $i)"
                echo "EXECUTE d('$key', 201, '$body')"; echo "COMMIT" ;;
            proc_*) echo "EXECUTE p('$key', '$h', $((i % 1000)), $i, '$body')" ;;
            replay_*) echo "EXECUTE c('$kp$((first_key + i % 20000))', '$h')" ;;
            client_bare)
                echo "BEGIN"
                echo "INSERT INTO bench.ledger (account_id, amount_cents) VALUES ($((i % 1000)), $i) RETURNING id"
                echo "COMMIT" ;;
            client_bare_prep) echo "BEGIN"; echo "EXECUTE l2($((i % 1000)), $i)"; echo "COMMIT" ;;
            client_guard | client_guard_hashed)
                echo "BEGIN"
                if [ "$c" = client_guard ]; then
                    client_claim "'$key'" "'POST'" "'/payments'" "'$req'" NULL "''"
                else
                    echo "SELECT c.outcome, c.http_status, c.response_body::text, c.response_headers::text FROM public.idem_claim('$key'::text, '$h'::text, NULL::interval, ''::text) AS c"
                fi
                echo "INSERT INTO bench.ledger (account_id, amount_cents) VALUES ($((i % 1000)), $i) RETURNING id"
                client_complete "'$key'" 201 "'$body'" "'$headers'" "''"
                echo "COMMIT" ;;
            client_guard_prep)
                echo "BEGIN"; echo "EXECUTE c2('$key', 'POST', '/payments', '$req', NULL, '')"
                echo "EXECUTE l2($((i % 1000)), $i)"; echo "EXECUTE d2('$key', 201, '$body', '$headers', '')"
                echo "COMMIT" ;;
            client13_prep)
                echo "BEGIN"; echo "EXECUTE c3('$key', '', 'POST', '/payments', '', 'application/json', $req13, NULL)"
                echo "EXECUTE l2($((i % 1000)), $i)"
                echo "EXECUTE d3('$key', '', 201, 'application/json', $loc13, $body13)"; echo "COMMIT" ;;
            client13)
                echo "BEGIN"; echo "SELECT idem_claim_request('$key', '', 'POST', '/payments', '', 'application/json', $req13, NULL)"
                echo "INSERT INTO bench.ledger (account_id, amount_cents) VALUES ($((i % 1000)), $i) RETURNING id"
                echo "SELECT idem_complete_request('$key', '', 201, 'application/json', $loc13, $body13)"; echo "COMMIT" ;;
            lease_*)
                echo "BEGIN"; echo "EXECUTE a('$key', '$h')"; echo "COMMIT"
                echo "BEGIN"; echo "EXECUTE l($((i % 1000)), $i)"; echo "EXECUTE b('$key', 201, '$body')"; echo "COMMIT" ;;
        esac
    done
}

count_instructions() {  # count_instructions CASE COUNT: total instructions of the backend
    local out=$dir/callgrind.$1.$2 db=bench
    [[ $1 == *_partitioned ]] && db=bench_partitioned
    statements "$1" "$2" >"$dir/input.sql"
    chown postgres "$dir/input.sql"
    su postgres -c "valgrind --tool=callgrind --callgrind-out-file=$out $PG_BIN/postgres --single \
        -D '$dir/data' -c shared_preload_libraries=idempotency -c fsync=off $db <'$dir/input.sql'" \
        >"$dir/single.log" 2>&1 || { cat "$dir/single.log" >&2; exit 1; }
    if grep -q "ERROR" "$dir/single.log"; then
        grep -m3 ERROR "$dir/single.log" >&2
        exit 1
    fi
    sed -nE 's/^summary: ([0-9]+)/\1/p' "$out"
}

printf "%-18s %12s\n" case "instr/request"
for c in $cases; do
    base=$(count_instructions "$c" 0)
    full=$(count_instructions "$c" "$n")
    printf "%-18s %12d\n" "$c" $(((full - base) / n))
done
