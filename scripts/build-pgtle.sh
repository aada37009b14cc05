#!/usr/bin/env bash
# Builds pg_tle (Trusted Language Extensions, a test dependency of the managed edition, never shipped) from its
# vendored source with PGXS into the PostgreSQL of PG_CONFIG (default the system's 15), for
# scripts/test-managed.sh. Run as root (or as the owner of that PostgreSQL's directories).
#   PG_CONFIG=/path/to/pg_config scripts/build-pgtle.sh
# The tarball is looked for at $IDEM_PGTLE_TARBALL, then at ../shared/vendor/pg_tle-2f4b7b3.tar.gz beside the
# clone (or beside the main checkout of a git worktree); its SHA-256 must match. Without it the script says so
# and exits 3, which the tests count as skipped, not passed. A finished build is left alone (a stamp file in the
# PostgreSQL's lib directory); IDEM_PGTLE_REBUILD=1 rebuilds. Needs Debian's libkrb5-dev (PostgreSQL's
# libpq-be.h includes gssapi/gssapi.h): scripts/install-deps.sh managed.
# A server loads it with shared_preload_libraries = 'pg_tle'.
set -euo pipefail
cd "$(dirname "$0")/.."

commit=2f4b7b3
sha256=4ddda7f5a3079b134b369a770214a8612fd1b9ce4f71534ded804a7879afb02e
pg_config=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
pkglibdir=$("$pg_config" --pkglibdir)
stamp=$pkglibdir/.idem-pgtle-built

if [ -f "$stamp" ] && [ "${IDEM_PGTLE_REBUILD:-0}" != 1 ] && [ -f "$pkglibdir/pg_tle.so" ] &&
   [ -f "$("$pg_config" --sharedir)/extension/pg_tle.control" ]; then
    echo "pg_tle already built in $pkglibdir ($(cat "$stamp"))"
    exit 0
fi

tarball=${IDEM_PGTLE_TARBALL:-}
if [ -z "$tarball" ]; then
    tarball=../shared/vendor/pg_tle-$commit.tar.gz
    # A git worktree sits elsewhere: look beside the main checkout too.
    common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
    if [ ! -f "$tarball" ] && [ -n "$common" ] && [ -f "$common/../../shared/vendor/pg_tle-$commit.tar.gz" ]; then
        tarball=$common/../../shared/vendor/pg_tle-$commit.tar.gz
    fi
fi
if [ ! -f "$tarball" ]; then
    echo "build-pgtle.sh: SKIPPED: no pg_tle source tarball at $tarball (set IDEM_PGTLE_TARBALL to pg_tle-$commit.tar.gz)"
    exit 3
fi
if ! echo "$sha256  $tarball" | sha256sum -c --quiet - >/dev/null 2>&1; then
    echo "build-pgtle.sh: $tarball is not pg_tle $commit: SHA-256 $(sha256sum "$tarball" | cut -d' ' -f1), expected $sha256" >&2
    exit 1
fi
if [ ! -f /usr/include/gssapi/gssapi.h ]; then
    echo "build-pgtle.sh: gssapi/gssapi.h is missing: install libkrb5-dev (scripts/install-deps.sh managed)" >&2
    exit 1
fi
start=$(date +%s)

work=$(mktemp -d /tmp/idem-pgtle-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xzf "$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'pg_tle-*' | head -1)
[ -n "$src" ] || { echo "build-pgtle.sh: the tarball holds no pg_tle-* directory" >&2; exit 1; }
cd "$src"
nice -n 10 make -s -j"${IDEM_PGTLE_JOBS:-2}" PG_CONFIG="$pg_config" >"$work/make.log" 2>&1 ||
    { tail -50 "$work/make.log"; exit 1; }
make -s install PG_CONFIG="$pg_config" >"$work/install.log" 2>&1 || { tail -50 "$work/install.log"; exit 1; }
echo "pg_tle $commit built in $(( $(date +%s) - start ))s" >"$stamp"
cat "$stamp"
