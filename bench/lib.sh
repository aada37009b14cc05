# Shared by the throughput benchmarks (bench/run.sh, bench/lease/run.sh); source this file from the repository's
# root after setting dir (the cluster's directory) and port.
source scripts/lib/cluster.sh

q() { psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres "$@"; }
qv() { q -At "$@"; }

# Builds and installs the extension, starts the cluster and creates database bench. Durable commits (fsync on) so
# that synchronous_commit matters; no checkpoint or autovacuum during a run: the benchmarks checkpoint before each
# run and vacuum after loading.
start_throughput_cluster() {
    echo "== build and install"
    make -s >/dev/null && make -s install >/dev/null
    echo "== cluster in $dir on port $port"
    start_cluster "$dir" "$port" "fsync = on" "shared_preload_libraries = 'idempotency'" \
        "shared_buffers = 1GB" "max_wal_size = 8GB" "checkpoint_timeout = 1h" "autovacuum = off"
    q -d postgres -c "CREATE DATABASE bench"
}
