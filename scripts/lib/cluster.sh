# The project's one way to run a throwaway PostgreSQL cluster, for the demo, the tests, the clients' harness and
# the benchmarks; source this file (bash). Run as root: the server runs as user postgres.
#
#   PG_BIN      the server's bin directory: Debian's 15 by default, /opt/idem-pg/17/bin or /opt/idem-pg/18/bin
#               (scripts/build-pg.sh) for the newer majors. Read at each call, so `PG_BIN=... start_cluster ...`
#               works for one call.
#   CLUSTER_INITDB_OPTS  more initdb options (the demo: "-E UTF8 --locale=C.UTF-8")
#
#   init_cluster DIR PORT [LINE...]   initdb into DIR/data as user postgres, PORT and socket directory DIR in
#                                     postgresql.conf, then the LINEs (later lines win: "fsync = on" undoes the
#                                     default "fsync = off"); the server is not started (pg_upgrade wants that)
#   start_cluster DIR PORT [LINE...]  init_cluster, then start; the server log is DIR/server.log
#   cluster_ctl DIR start|stop|restart [PG_CTL-OPTION...]   pg_ctl as user postgres on an initialised DIR
#   stop_cluster DIR                  stop at once (-m immediate) and remove DIR: the end of a throwaway cluster
#   copy_source_tree DIR              the extension's sources copied into DIR (owned by postgres; no .git, bench/,
#                                     clients/ or build products), to build them for another PostgreSQL than the
#                                     checkout's own build
#
# Every function returns non-zero on failure, after printing the end of initdb's or the server's log to stderr.
# Connect over the socket: psql -h DIR -p PORT -U postgres (trust authentication); TCP on 127.0.0.1 works too.

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

# As user postgres from DIR: root's working directory may be one postgres cannot enter.
_cluster_as_postgres() {  # _cluster_as_postgres DIR COMMAND...
    local dir=$1
    shift
    (cd "$dir" && su postgres -c "$(printf '%q ' "$@")")
}

init_cluster() {
    local dir=$1 port=$2 line
    shift 2
    case $dir in /*) ;; *) echo "init_cluster: DIR must be an absolute path, not '$dir'" >&2; return 2 ;; esac
    mkdir -p "$dir"
    chown postgres "$dir"
    # shellcheck disable=SC2086  # CLUSTER_INITDB_OPTS is a list of options
    if ! _cluster_as_postgres "$dir" "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres --no-sync \
            ${CLUSTER_INITDB_OPTS:-} >"$dir/initdb.log" 2>&1; then
        tail -n 20 "$dir/initdb.log" >&2
        return 1
    fi
    {
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "listen_addresses = '127.0.0.1'"
        echo "fsync = off"
        for line in "$@"; do echo "$line"; done
    } >>"$dir/data/postgresql.conf"
}

cluster_ctl() {
    local dir=$1 action=$2
    shift 2
    [ "$action" = stop ] || set -- -l "$dir/server.log" "$@"
    if ! _cluster_as_postgres "$dir" "$PG_BIN/pg_ctl" -D "$dir/data" -w "$@" "$action" >/dev/null 2>&1; then
        echo "pg_ctl $action failed in $dir" >&2
        [ -f "$dir/server.log" ] && tail -n 20 "$dir/server.log" >&2
        return 1
    fi
}

start_cluster() {
    init_cluster "$@" && cluster_ctl "$1" start
}

stop_cluster() {
    local dir=$1
    [ -f "$dir/data/postmaster.pid" ] && cluster_ctl "$dir" stop -m immediate
    rm -rf "$dir"
    return 0
}

copy_source_tree() {
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    mkdir -p "$1"
    tar -C "$root" --exclude=./.git --exclude=./bench --exclude=./clients --exclude='*.o' --exclude='*.so' \
        --exclude='*.bc' --exclude=./results --exclude=./output_iso --exclude=./regression.diffs \
        --exclude=./regression.out -cf - . | tar -C "$1" -xf -
    chown -R postgres "$1"
}
