#!/usr/bin/env bash
# Builds PostgreSQL MAJOR (17 or 18) from Debian's own source package into /opt/idem-pg/MAJOR, for the tests
# against newer servers (scripts/test-versions.sh). Run as root on Debian 12 (bookworm).
#   scripts/build-pg.sh 17      # postgresql-17 from trixie
#   scripts/build-pg.sh 18      # postgresql-18 from forky
# The build is minimal: no ICU, readline, zlib or LLVM; TAP test modules, pg_regress, pg_isolation_regress and the
# contrib module the tests use (amcheck) are installed too, and pgTAP (pure SQL) is copied from Debian's
# postgresql-15-pgtap. A finished prefix is left alone (rerunning is cheap); IDEM_PG_REBUILD=1 rebuilds.
# IDEM_PG_ROOT overrides /opt/idem-pg.
set -euo pipefail

major=${1:?usage: build-pg.sh MAJOR (17 or 18)}
case $major in
    17) suite=trixie ;;
    18) suite=forky ;;
    *) echo "build-pg.sh: no Debian suite known for PostgreSQL $major" >&2; exit 2 ;;
esac
root=${IDEM_PG_ROOT:-/opt/idem-pg}
prefix=$root/$major
stamp=$prefix/.idem-built
jobs=${IDEM_PG_JOBS:-$(nproc)}

if [ -f "$stamp" ] && [ "${IDEM_PG_REBUILD:-0}" != 1 ]; then
    echo "PostgreSQL $major already built in $prefix ($(cat "$stamp"))"
    exit 0
fi
start=$(date +%s)

# What the build needs, from bookworm (scripts/install-deps.sh, group pg-build). A release tarball carries the
# bison and flex output; they are installed only when it does not (checked below).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/install-deps.sh" pg-build
export DEBIAN_FRONTEND=noninteractive

# Source entries of the suite that carries postgresql-MAJOR. Bookworm's debian-archive-keyring has the
# trixie keys, which also sign trixie and forky (testing).
sources=/etc/apt/sources.list.d/idem-src-$suite.sources
if [ ! -f "$sources" ]; then
    cat >"$sources" <<EOF
# Added by idempotency's scripts/build-pg.sh: source packages only, nothing is installed from $suite.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
fi
work=$(mktemp -d /tmp/idem-pg-build-$major.XXXXXX)
trap 'rm -rf "$work"' EXIT
# Only the new source list needs fetching; the others stay as they are.
apt-get -o DPkg::Lock::Timeout=900 update -qq -o Dir::Etc::sourcelist="$sources" -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0
(cd "$work" && apt-get source --download-only -qq "postgresql-$major/$suite" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
tarball=$(ls "$work"/postgresql-"$major"_*.orig.tar.* 2>/dev/null | head -1 || true)
if [ -z "$tarball" ]; then
    # The mirror may lack the newest upload's files while its index already names them (seen for
    # postgresql-17 17.12-0+deb13u1: 404). Fall back to the previous point releases with the same Debian
    # revision, at most three, fetched by their pool path: the .dsc must carry a valid signature of a Debian
    # developer (debian-keyring) and the tarball the SHA-256 that .dsc lists.
    version=$(apt-cache showsrc "postgresql-$major" | awk '/^Version:/ {print $2}' | sort -V | tail -1)
    directory=$(apt-cache showsrc "postgresql-$major" | awk '/^Directory:/ {print $2; exit}')
    upstream=${version%%-*}
    revision=${version#*-}
    "$here/install-deps.sh" debian-keyring
    minor=${upstream#*.}
    for try in 1 2 3; do
        minor=$((minor - 1))
        [ "$minor" -ge 0 ] || break
        dsc=postgresql-${major}_$major.$minor-$revision.dsc
        echo "apt-get source failed for $version; trying $dsc from the pool"
        curl -fsS -o "$work/$dsc" "http://deb.debian.org/debian/$directory/$dsc" 2>/dev/null || continue
        gpgv --keyring /usr/share/keyrings/debian-keyring.gpg "$work/$dsc" 2>/dev/null \
            || { echo "build-pg.sh: bad signature on $dsc" >&2; exit 1; }
        orig=$(awk '/^Checksums-Sha256:/ {f=1; next} /^[^ ]/ {f=0} f && $3 ~ /orig\.tar/ {print $3; exit}' "$work/$dsc")
        sum=$(awk -v o="$orig" '/^Checksums-Sha256:/ {f=1; next} /^[^ ]/ {f=0} f && $3 == o {print $1; exit}' "$work/$dsc")
        curl -fsS -o "$work/$orig" "http://deb.debian.org/debian/$directory/$orig" || continue
        echo "$sum  $work/$orig" | sha256sum -c --quiet - || { echo "build-pg.sh: checksum mismatch on $orig" >&2; exit 1; }
        tarball=$work/$orig
        break
    done
fi
[ -n "$tarball" ] || { echo "build-pg.sh: no upstream tarball of postgresql-$major downloaded" >&2; exit 1; }
echo "source: $(basename "$tarball")"
tar -xf "$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'postgresql-*' | head -1)

if [ ! -f "$src/src/backend/parser/gram.c" ]; then
    echo "not a release tarball: installing bison and flex"
    "$here/install-deps.sh" pg-build-grammar
fi

rm -rf "$prefix"
cd "$src"
./configure -q --prefix="$prefix" --without-icu --without-readline --without-zlib --without-llvm \
    --enable-tap-tests --enable-debug CFLAGS='-O2' >"$work/configure.log" 2>&1 \
    || { cat "$work/configure.log"; exit 1; }
make -s -j"$jobs" >"$work/make.log" 2>&1 || { tail -50 "$work/make.log"; exit 1; }
make -s install >/dev/null
# pgxs's test drivers and modules: pg_regress comes with make install; the isolation tester and the
# PostgreSQL::Test perl modules do not.
make -s -j"$jobs" -C src/test/isolation >/dev/null
make -s -C src/test/isolation install >/dev/null
make -s -C src/test/regress install >/dev/null
make -s -C src/test/perl install >/dev/null
# Contrib modules the suites create: amcheck (sql/fast_path.sql).
for module in amcheck; do
    make -s -j"$jobs" -C "contrib/$module" >/dev/null
    make -s -C "contrib/$module" install >/dev/null
done

# pgTAP is SQL only: Debian's copy for 15 fits every version.
cp /usr/share/postgresql/15/extension/pgtap* "$("$prefix/bin/pg_config" --sharedir)/extension/"

# User postgres runs initdb and the servers from this prefix.
chmod -R a+rX "$root"
elapsed=$(( $(date +%s) - start ))
echo "PostgreSQL $("$prefix/bin/pg_config" --version | awk '{print $2}') built in ${elapsed}s" >"$stamp"
cat "$stamp"
