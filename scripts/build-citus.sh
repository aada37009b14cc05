#!/usr/bin/env bash
# Builds Citus 14.0.1 (a test dependency, never shipped) from its source release into the PostgreSQL 17 that
# scripts/build-pg.sh builds (/opt/idem-pg/17), for scripts/test-citus.sh. Run as root.
#   scripts/build-citus.sh
# The tarball is looked for at $IDEM_CITUS_TARBALL, then at ../shared/vendor/citus-14.0.1.tar.gz beside the clone
# (or beside the main checkout of a git worktree);
# its SHA-256 must match. Without it the script says so and exits 3, which the tests count as skipped, not passed.
# A finished build is left alone (a stamp file in the prefix); IDEM_CITUS_REBUILD=1 rebuilds.
# IDEM_PG_ROOT overrides /opt/idem-pg.
set -euo pipefail
cd "$(dirname "$0")/.."

version=14.0.1
sha256=26ddb8ec9de07c5fa8426e435d10936e5cd6bed01a5ad94aab92e818081e5ec9
prefix=${IDEM_PG_ROOT:-/opt/idem-pg}/17
pg_config=$prefix/bin/pg_config
stamp=$prefix/.idem-citus-built

if [ -f "$stamp" ] && [ "${IDEM_CITUS_REBUILD:-0}" != 1 ] &&
   [ -f "$("$pg_config" --pkglibdir)/citus.so" ]; then
    echo "Citus already built in $prefix ($(cat "$stamp"))"
    exit 0
fi

tarball=${IDEM_CITUS_TARBALL:-}
if [ -z "$tarball" ]; then
    tarball=../shared/vendor/citus-$version.tar.gz
    # A git worktree sits elsewhere: look beside the main checkout too.
    common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
    if [ ! -f "$tarball" ] && [ -n "$common" ] && [ -f "$common/../../shared/vendor/citus-$version.tar.gz" ]; then
        tarball=$common/../../shared/vendor/citus-$version.tar.gz
    fi
fi
if [ ! -f "$tarball" ]; then
    echo "build-citus.sh: SKIPPED: no Citus source tarball at $tarball (set IDEM_CITUS_TARBALL to citus-$version.tar.gz)"
    exit 3
fi
if ! echo "$sha256  $tarball" | sha256sum -c --quiet - >/dev/null 2>&1; then
    echo "build-citus.sh: $tarball is not Citus $version: SHA-256 $(sha256sum "$tarball" | cut -d' ' -f1), expected $sha256" >&2
    exit 1
fi
if [ ! -x "$pg_config" ]; then
    scripts/build-pg.sh 17
fi
start=$(date +%s)

work=$(mktemp -d /tmp/idem-citus-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xzf "$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'citus-*' | head -1)
[ -n "$src" ] || { echo "build-citus.sh: the tarball holds no citus-* directory" >&2; exit 1; }
cd "$src"
# No libcurl (statistics collection), lz4 or zstd (columnar compression): none is needed by the tests, and
# Debian 12 would need their -dev packages.
nice -n 10 ./configure -q PG_CONFIG="$pg_config" --without-libcurl --without-lz4 --without-zstd \
    >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
nice -n 10 make -s -j"${IDEM_CITUS_JOBS:-2}" >"$work/make.log" 2>&1 || { tail -50 "$work/make.log"; exit 1; }
make -s install >"$work/install.log" 2>&1 || { tail -50 "$work/install.log"; exit 1; }
chmod -R a+rX "$prefix"
echo "Citus $version built in $(( $(date +%s) - start ))s" >"$stamp"
cat "$stamp"
