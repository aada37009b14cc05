#!/usr/bin/env bash
# The Debian package as a DBA gets it: scripts/package.sh builds postgresql-NN-idempotency from a clean tree
# (lintian must pass), then for each package built: `apt-get install ./postgresql-NN-idempotency_*.deb` into the
# system's PostgreSQL NN, pg_regress and the isolation specs (`make installcheck`, nothing built or installed from
# the checkout) against a fresh cluster of that server that preloads the library, an update from 1.0 through every
# packaged update script, then `apt-get purge` and a check that no file of the package is left.
#
# A file missing from the package fails the suites: the files of an earlier `make install` into the same server
# (scripts/test.sh's build stage) are moved aside for the duration and put back at the end, so only the package's
# files are there while the tests run. Run as root. Prints "<suite> N passed, N failed" per suite.
#   IDEM_PACKAGE_PORT   the cluster's port (default 55434)
#   IDEM_PACKAGE_DEBS   directory of already built packages (skips the build)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/cluster.sh
port=${IDEM_PACKAGE_PORT:-55434}

log_dir=$(mktemp -d /tmp/idem-package-logs.XXXXXX)
COUNT_FORMAT='%s %d passed, %d failed\n'
source scripts/lib/count.sh
work=$(mktemp -d /tmp/idem-test-package.XXXXXX)
chmod 755 "$work"
installed_pkg=
aside=$work/aside
cluster=

apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 -y -qq "$@"; }

# Puts back what install_package moved aside (after the package is gone).
restore_aside() {
    [ -d "$aside" ] || return 0
    (cd "$aside" && find . -type f -print0) | while IFS= read -r -d '' f; do
        mkdir -p "/$(dirname "$f")"
        mv -f "$aside/$f" "/$f"
    done
    rm -rf "$aside"
}

cleanup() {
    [ -n "$cluster" ] && PG_BIN=$pg_bin stop_cluster "$cluster"
    [ -n "$installed_pkg" ] && apt_get purge "$installed_pkg" >/dev/null 2>&1
    restore_aside
    rm -rf "$work" "$log_dir"
}
trap cleanup EXIT

scripts/install-deps.sh core tests release || { count package-deps 0 1; cat "$log_dir/summary"; exit 1; }

debs=${IDEM_PACKAGE_DEBS:-$work/dist}
if [ -z "${IDEM_PACKAGE_DEBS:-}" ]; then
    run_single package-build scripts/package.sh "$debs"
fi

# The sources the tests run from: sql/, expected/ and test/isolation/ of a copy with no build products in it.
copy_source_tree "$work/src"
(cd "$work/src" && rm -f ./*.sql ./*.so)

# install_package DEB: moves aside every file of DEB already present in the system (a `make install`'s), then
# installs DEB with apt, as a user would.
install_package() {
    local deb=$1 f
    mkdir -p "$aside"
    while read -r f; do
        f=${f#.}
        if [ -f "$f" ] && ! dpkg -S "$f" >/dev/null 2>&1; then
            mkdir -p "$aside$(dirname "$f")"
            mv "$f" "$aside$f"
        fi
    done < <(dpkg-deb --fsys-tarfile "$deb" | tar -t | grep -v '/$')
    apt_get install "$deb"
}

for deb in "$debs"/postgresql-*-idempotency_*.deb; do
    [ -e "$deb" ] || { count package-build 0 1; break; }
    pkg=$(dpkg-deb -f "$deb" Package)
    major=${pkg#postgresql-}
    major=${major%%-*}
    pg_bin=/usr/lib/postgresql/$major/bin
    deb=$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")

    installed_pkg=$pkg
    run_single "package-install-pg$major" install_package "$deb"
    dpkg-query -L "$pkg" >"$work/$pkg.files"

    cluster=$work/cluster-$major
    if PG_BIN=$pg_bin start_cluster "$cluster" "$port" "shared_preload_libraries = 'idempotency'" \
            "max_prepared_transactions = 10"; then
        export PGHOST=$cluster PGPORT=$port PGUSER=postgres
        (cd "$work/src" && make -s installcheck ISOLATION= PG_CONFIG="$pg_bin/pg_config") 2>&1 |
            tee "$log_dir/regress.log"
        count_regress "package-regress-pg$major" "$log_dir/regress.log" "${PIPESTATUS[0]}"
        [ -f "$work/src/regression.diffs" ] && cat "$work/src/regression.diffs"
        (cd "$work/src" && make -s installcheck REGRESS= PG_CONFIG="$pg_bin/pg_config") 2>&1 |
            tee "$log_dir/isolation.log"
        count_regress "package-isolation-pg$major" "$log_dir/isolation.log" "${PIPESTATUS[0]}"
        [ -f "$work/src/output_iso/regression.diffs" ] && cat "$work/src/output_iso/regression.diffs"
        # Every packaged update script: 1.0 and up to the default version, and the worker of the preloaded library.
        run_single "package-update-pg$major" psql -X -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE pkg_update" \
            -c '\c pkg_update' -c "CREATE EXTENSION idempotency VERSION '1.0'" -c "ALTER EXTENSION idempotency UPDATE" \
            -c "SELECT 1/count(*) FROM pg_extension WHERE extname = 'idempotency' AND extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency')" \
            -c "SELECT 1/count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'"
        unset PGHOST PGPORT PGUSER
        PG_BIN=$pg_bin stop_cluster "$cluster"
    else
        count "package-cluster-pg$major" 0 1
    fi
    cluster=

    # Purged: nothing of the package is left behind.
    remove_package() {
        apt_get purge "$pkg" || return 1
        installed_pkg=
        local left
        left=$(grep -E '\.(so|sql|control|bc)$' "$work/$pkg.files" | while read -r f; do [ -e "$f" ] && echo "$f"; done)
        [ -z "$left" ] || { echo "left after purge: $left"; return 1; }
    }
    run_single "package-remove-pg$major" remove_package
    restore_aside
done

cat "$log_dir/summary"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
