# Throwaway PostgreSQL 15 clusters for the tests and the demo; source this file.
# start_cluster DIR PORT [postgresql.conf lines...]: initdb as user postgres and start on PORT, socket in DIR.
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

start_cluster() {
    local dir=$1 port=$2
    shift 2
    mkdir -p "$dir"
    chown postgres "$dir"
    su postgres -c "$PG_BIN/initdb -D '$dir/data' -A trust -U postgres --no-sync" >/dev/null
    {
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "listen_addresses = '127.0.0.1'"
        echo "fsync = off"
        for line in "$@"; do echo "$line"; done
    } >>"$dir/data/postgresql.conf"
    su postgres -c "$PG_BIN/pg_ctl -D '$dir/data' -l '$dir/server.log' -w start" >/dev/null
}

stop_cluster() {
    local dir=$1
    [ -d "$dir/data" ] && su postgres -c "$PG_BIN/pg_ctl -D '$dir/data' -m immediate -w stop" >/dev/null 2>&1
    rm -rf "$dir"
}
