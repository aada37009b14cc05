#!/bin/sh
# Builds vendor/ from the Go sources Debian's golang-*-dev packages install under /usr/share/gocode/src, so that
# `go build -mod=vendor` works offline (GOPROXY=off) in ordinary module mode. Each module that go.mod requires
# becomes a symlink vendor/<module> -> /usr/share/gocode/src/<module>; vendor/modules.txt lists the packages the
# build imports, as `go mod vendor` would write it. vendor/ is generated, never committed.
set -eu
cd "$(dirname "$0")"
GOCODE=${GOCODE:-/usr/share/gocode/src}
[ -d "$GOCODE" ] || { echo "debian-vendor.sh: $GOCODE missing (apt-get install golang-github-jackc-pgx-v4-dev)" >&2; exit 1; }

self=$(awk '$1 == "module" { print $2; exit }' go.mod)
# "path version" for every requirement in go.mod, block form or single-line form.
reqs=$(awk '
    /^require[ \t]*\($/ { inblock = 1; next }
    inblock && /^\)/    { inblock = 0; next }
    inblock && NF >= 2  { print $1, $2; next }
    /^require[ \t]+[^(]/ { print $2, $3 }' go.mod)

# Debian installs some major-version modules without their /vN suffix (github.com/labstack/echo holds module
# github.com/labstack/echo/v4). srcdir gives the Debian folder of a module path; a scratch GOPATH entry links the
# /vN paths to those folders so that the GOPATH-mode lookups below find them.
srcdir() {
    if [ -d "$GOCODE/$1" ]; then echo "$GOCODE/$1"; return; fi
    base=${1%/v[0-9]*}
    if [ "$base" != "$1" ] && [ -f "$GOCODE/$base/go.mod" ] &&
        [ "$(awk '$1 == "module" { print $2; exit }' "$GOCODE/$base/go.mod")" = "$1" ]; then
        echo "$GOCODE/$base"; return
    fi
    return 1
}
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
for mod in $(echo "$reqs" | awk '{print $1}'); do
    [ -d "$GOCODE/$mod" ] && continue
    dir=$(srcdir "$mod") || continue
    mkdir -p "$shim/src/$(dirname "$mod")"
    ln -s "$dir" "$shim/src/$mod"
done

# External packages our code imports (tests included), found in GOPATH mode so no module lookup happens.
roots=$(GO111MODULE=off GOPATH=/nonexistent go list -e \
        -f '{{join .Imports "\n"}}{{"\n"}}{{join .TestImports "\n"}}{{"\n"}}{{join .XTestImports "\n"}}' ./... |
    grep '\.' | grep -v "^$self" | sort -u)
# Every non-standard package those need, from the Debian tree.
pkgs=$(GO111MODULE=off GOPATH="$shim:${GOCODE%/src}" go list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' $roots | sort -u)

rm -rf vendor
mkdir vendor
: >vendor/modules.txt
echo "$reqs" | while read -r mod ver; do
    [ -n "$mod" ] || continue
    dir=$(srcdir "$mod") || { echo "debian-vendor.sh: $mod not in $GOCODE" >&2; exit 1; }
    mkdir -p "vendor/$(dirname "$mod")"
    ln -s "$dir" "vendor/$mod"
    gover=$(awk '$1 == "go" { print $2; exit }' "$dir/go.mod" 2>/dev/null || true)
    echo "# $mod $ver" >>vendor/modules.txt
    if [ -n "$gover" ]; then echo "## explicit; go $gover" >>vendor/modules.txt; else echo "## explicit" >>vendor/modules.txt; fi
    # The packages of this module: those under its path that no longer (more specific) required module owns.
    for p in $pkgs; do
        case "$p" in "$mod"|"$mod"/*) ;; *) continue ;; esac
        owner=$mod
        for other in $(echo "$reqs" | awk '{print $1}'); do
            case "$p" in "$other"|"$other"/*) [ ${#other} -gt ${#owner} ] && owner=$other ;; esac
        done
        [ "$owner" = "$mod" ] && echo "$p" >>vendor/modules.txt
    done
done
# Every package needed must belong to a required module, or the build would fail later with a vaguer message.
for p in $pkgs; do
    grep -qx "$p" vendor/modules.txt || { echo "debian-vendor.sh: $p is needed but its module is not in go.mod" >&2; exit 1; }
done
