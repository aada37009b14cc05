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

# External packages our code imports (tests included), found in GOPATH mode so no module lookup happens.
roots=$(GO111MODULE=off GOPATH=/nonexistent go list -e \
        -f '{{join .Imports "\n"}}{{"\n"}}{{join .TestImports "\n"}}{{"\n"}}{{join .XTestImports "\n"}}' ./... |
    grep '\.' | grep -v "^$self" | sort -u)
# Every non-standard package those need, from the Debian tree.
pkgs=$(GO111MODULE=off GOPATH="${GOCODE%/src}" go list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' $roots | sort -u)

rm -rf vendor
mkdir vendor
: >vendor/modules.txt
echo "$reqs" | while read -r mod ver; do
    [ -n "$mod" ] || continue
    [ -f "$GOCODE/$mod/go.mod" ] || [ -d "$GOCODE/$mod" ] || { echo "debian-vendor.sh: $mod not in $GOCODE" >&2; exit 1; }
    mkdir -p "vendor/$(dirname "$mod")"
    ln -s "$GOCODE/$mod" "vendor/$mod"
    gover=$(awk '$1 == "go" { print $2; exit }' "$GOCODE/$mod/go.mod" 2>/dev/null || true)
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
