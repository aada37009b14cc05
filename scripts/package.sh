#!/usr/bin/env bash
# Builds the Debian packages postgresql-NN-idempotency as apt.postgresql.org builds extensions (pg_buildext and
# debhelper's pgxs_loop add-on, debian/), from a clean tree: the files git tracks, copied out of the checkout (with
# their working-tree contents, so an uncommitted edit is packaged as it would be committed; untracked files and
# build outputs are not). One package per major in debian/pgversions (15+) whose postgresql-server-dev-NN is
# installed. Then lintian, which must report no error and no warning (debian/*.lintian-overrides say why each
# remaining tag is right).
#
#   scripts/package.sh [OUTDIR]     the .deb, .buildinfo and .changes go into OUTDIR (default dist/)
#
# IDEM_PACKAGE_CHECK=1 also runs the build-time tests (dh_pgxs_test: pg_regress and the isolation specs against
# the files about to be packaged); scripts/test.sh leaves them out and tests the installed package instead
# (scripts/test-package.sh). Needs the release group of scripts/install-deps.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)

version=$(dpkg-parsechangelog -l "$root/debian/changelog" -S Version)
work=$(mktemp -d /tmp/idem-package.XXXXXX)
chmod 755 "$work"   # the build-time tests run the server as user postgres
trap 'rm -rf "$work"' EXIT
src=$work/idempotency-${version%-*}

# The clean tree: tracked files that exist (a file deleted but not yet committed is left out, as git would).
mkdir -p "$src"
(cd "$root" && git ls-files -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf -) | tar -C "$src" -xf -

export PG_SUPPORTED_VERSIONS=installed   # every major whose postgresql-server-dev-NN is installed
export PG_UPDATECONTROL=yes              # debian/control regenerated for those majors from debian/control.in
[ "${IDEM_PACKAGE_CHECK:-0}" = 1 ] || export DEB_BUILD_OPTIONS="nocheck${DEB_BUILD_OPTIONS:+ $DEB_BUILD_OPTIONS}"
echo "package.sh: building idempotency $version for PostgreSQL $(cd "$src" && pg_buildext supported-versions | xargs)"
(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
    tail -n 60 "$work/build.log"
    echo "package.sh: dpkg-buildpackage failed (log above)" >&2
    exit 1
}
changes=$(ls "$work"/idempotency_"${version}"_*.changes)

# lintian: errors and warnings fail the build; info and pedantic tags are printed for the record.
lintian --fail-on error,warning --display-info "$changes" | tee "$work/lintian.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || { echo "package.sh: lintian failed" >&2; exit 1; }

for f in $(awk '/^Files:/ {on = 1; next} /^[^ ]/ {on = 0} on {print $5}' "$changes"); do
    cp "$work/$f" "$out/"
done
cp "$changes" "$work/build.log" "$out/"
ls "$out"/*.deb
