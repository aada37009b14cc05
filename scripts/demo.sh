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
cleanup() {
    if [ -f "$work/data/postmaster.pid" ]; then
        runuser -u postgres -- "$pg_bin/pg_ctl" -D "$work/data" -m fast -w stop >/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
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
chown postgres: "$work"
cd "$work"    # postgres cannot read root's working directory
if ! runuser -u postgres -- "$pg_bin/initdb" -D "$work/data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 \
        --no-sync >"$work/initdb.log" 2>&1; then
    cat "$work/initdb.log" >&2
    exit 1
fi
if ! runuser -u postgres -- "$pg_bin/pg_ctl" -D "$work/data" -l "$work/postgres.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $work" start >/dev/null; then
    cat "$work/postgres.log" >&2
    exit 1
fi

export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=payments_demo
step "creating database $PGDATABASE: CREATE EXTENSION idempotency, examples/payment_schema.sql, examples/payment_procedure.sql"
"$pg_bin/createdb" "$PGDATABASE"
"$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION idempotency' \
    -f "$repo/examples/payment_schema.sql" -f "$repo/examples/payment_procedure.sql"

step "playing the payment story (examples/payment_service.pl)"
perl "$repo/examples/payment_service.pl"
