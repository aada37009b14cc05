#!/usr/bin/env bash
# The README's demo. On Debian 12, as root: installs the dependencies, builds and installs the extension,
# starts a throwaway PostgreSQL 15 cluster and plays the payment story of examples/payment_service.pl.
# The cluster and its directory are removed on exit. DEMO_PORT picks the port (default: a free one).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pg_bin=/usr/lib/postgresql/15/bin

if [ "$(id -u)" -ne 0 ]; then
    echo "run as root: the demo installs packages and the extension" >&2
    exit 1
fi

step() { echo "== $*"; }

step "installing dependencies (scripts/install-deps.sh)"
"$repo/scripts/install-deps.sh"

work=$(mktemp -d -t idempotency-demo.XXXXXX)
source "$repo/scripts/lib/cluster.sh"
PG_BIN=$pg_bin
trap 'stop_cluster "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "building and installing the extension (make && make install)"
if ! { make -C "$repo" -j"$(nproc)" PG_CONFIG="$pg_bin/pg_config" &&
       make -C "$repo" PG_CONFIG="$pg_bin/pg_config" install; } >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    exit 1
fi

# A port the kernel says is free; never 5432, where Debian's own cluster may be listening.
port=${DEMO_PORT:-$(perl -MIO::Socket::INET -e \
    'print IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1", LocalPort => 0)->sockport')}
step "starting a throwaway PostgreSQL 15 on 127.0.0.1:$port in $work"
CLUSTER_INITDB_OPTS="-E UTF8 --locale=C.UTF-8" start_cluster "$work" "$port" "fsync = on"

export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=payments_demo
step "creating database $PGDATABASE: CREATE EXTENSION idempotency, examples/payment_schema.sql, examples/payment_procedure.sql"
"$pg_bin/createdb" "$PGDATABASE"
"$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION idempotency' \
    -f "$repo/examples/payment_schema.sql" -f "$repo/examples/payment_procedure.sql"

step "playing the payment story (examples/payment_service.pl)"
perl "$repo/examples/payment_service.pl"
