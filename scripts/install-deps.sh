#!/usr/bin/env bash
# Installs everything the build, the demo, the tests and the benchmark need, from Debian's packages.
# Safe to run again: apt-get skips what is already there.
set -euo pipefail

packages=(
    build-essential g++ make git ca-certificates
    postgresql-15 postgresql-server-dev-15 postgresql-contrib
    libssl-dev
    googletest libgtest-dev cmake
    clang-14 libclang-rt-14-dev
    postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl
    libipc-run-perl libdbd-pg-perl
    postgresql-15-cron
    sqlsmith
    gnuplot-nox
)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts a default cluster on install; the tests make their own.
