#!/usr/bin/env bash
# Pools the claims of several runs of alternating.sh: bench/cleanup/pool.sh OUT_DIR...
# Each run keeps every claim of each side in raw/pooled_{on,off}_cN; this puts the runs' claims
# together per client count and prints the p99 of each side and their ratio, against the
# 1.2x target. Runs pooled should share the settings (pace, batch, rate): the script checks
# nothing but that the files are there.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
[ $# -gt 0 ] || { echo "usage: $0 OUT_DIR..." >&2; exit 2; }
echo "| clients | runs | p99 without (claims) | p99 with the sweep (claims) | p99 ratio, pooled (target <= 1.2x) |"
echo "|---|---|---|---|---|"
for clients in 1 2 4 8; do
    off=() on=()
    for dir in "$@"; do
        [ -f "$dir/raw/pooled_off_c$clients" ] && [ -f "$dir/raw/pooled_on_c$clients" ] || continue
        off+=("$dir/raw/pooled_off_c$clients") on+=("$dir/raw/pooled_on_c$clients")
    done
    [ ${#off[@]} -gt 0 ] || continue
    tmp=$(mktemp -d)
    cat "${off[@]}" > "$tmp/off"
    cat "${on[@]}" > "$tmp/on"
    p99_off=$(p99_of "$tmp/off") p99_on=$(p99_of "$tmp/on")
    ratio=$(calc "$p99_on / $p99_off" 3)
    echo "| $clients | ${#off[@]} | $p99_off ms ($(wc -l < "$tmp/off")) | $p99_on ms ($(wc -l < "$tmp/on")) | **${ratio}x** $(pass "$ratio <= 1.2") |"
    rm -rf "$tmp"
done
