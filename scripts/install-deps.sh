#!/usr/bin/env bash
# The project's one list of Debian 12 (bookworm) packages, in groups. As root:
#   scripts/install-deps.sh                  core and tests: build the extension and run scripts/test.sh's own suites
#   scripts/install-deps.sh core             only what `make && make install` needs
#   scripts/install-deps.sh core tests clients bench
#   scripts/install-deps.sh --list GROUP...  print the packages of the groups, one a line, install nothing
#
# Groups:
#   core      compiler, PostgreSQL 15 server and headers, OpenSSL
#   tests     GoogleTest, clang's libFuzzer and sanitizers, pgTAP and pg_prove, the Perl TAP modules (IPC::Run, DBD::Pg),
#             pg_cron (the worker's coexistence test), sqlsmith
#   valgrind  test/robustness/valgrind.sh (not part of scripts/test.sh)
#   clients   Go, Node.js, Python and the libraries and frameworks of the clients and their sample services,
#             PgBouncer, wrk, curl, psql: clients/run-tests.sh and every clients/<lang>/test.sh
#   java      clients/java (the Servlet filter and its Tomcat sample), built offline by Maven against Debian's Maven
#             repository (/usr/share/maven-repo): the JDK 17, Maven and the plugins a jar's lifecycle runs, pgjdbc,
#             Tomcat 10.1, JUnit 5; clients/run-tests.sh installs it with clients
#   ruby      clients/ruby (issue 42): Ruby 3.1 and Debian's gems (pg, rack, sinatra, minitest), unicorn (the sample
#             service's server): clients/run-tests.sh and clients/ruby/test.sh (rubygems.org is never asked)
#   bench     bench/run.sh's chart (gnuplot), and the groups valgrind (bench/instructions.sh) and clients (bench/clients)
#   release   scripts/package.sh and its tests: the Debian package (pg_buildext's debhelper add-on in
#             postgresql-server-dev-all, lintian), PGXN (pgxnclient), the clients' artifacts (python3-build, venv),
#             Prometheus' promtool and postgres_exporter (contrib/prometheus)
#   managed   scripts/test-managed.sh: building pg_tle from its vendored source (libkrb5-dev: PostgreSQL's
#             libpq-be.h includes gssapi/gssapi.h), with the tests group's pg_cron
#   pg-build  what scripts/build-pg.sh needs to build PostgreSQL 17 and 18 from Debian's source packages
#   pg-build-grammar, debian-keyring: installed by scripts/build-pg.sh only when the source needs them
#
# Safe to run again: it asks apt only for packages not installed yet. apt waits up to 15 minutes for another apt
# or dpkg run to finish (DPkg::Lock::Timeout) instead of failing. Citus is not a Debian package:
# scripts/build-citus.sh builds it from a vendored tarball into PostgreSQL 17 with the pg-build group's tools.
set -euo pipefail

declare -A groups=(
    [core]="build-essential g++ make git ca-certificates postgresql-15 postgresql-server-dev-15 postgresql-contrib
            libssl-dev"
    [tests]="googletest libgtest-dev cmake clang-14 libclang-rt-14-dev
             postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl libipc-run-perl libdbd-pg-perl
             postgresql-15-cron sqlsmith"
    [valgrind]="valgrind"
    [clients]="golang-go golang-github-jackc-pgx-v4-dev golang-github-labstack-echo-dev
               golang-github-gin-gonic-gin-dev golang-github-go-chi-chi-dev nodejs:node npm:npm
               python3-psycopg python3-psycopg-pool python3-pytest python3-waitress python3-starlette
               python3-fastapi python3-uvicorn python3-httpx python3-anyio python3-sqlalchemy python3-psycopg2
               python3-django python3-multipart python3-build python3-venv pgbouncer wrk curl postgresql-client"
    [java]="default-jdk-headless maven libpostgresql-jdbc-java libtomcat10-java junit5
            libmaven-compiler-plugin-java libmaven-resources-plugin-java libsurefire-java libmaven-jar-plugin-java
            libmaven-install-plugin-java libmaven-dependency-plugin-java"
    [ruby]="ruby ruby-pg ruby-rack ruby-sinatra ruby-rails ruby-minitest unicorn"
    [bench]="gnuplot-nox"
    [managed]="build-essential libkrb5-dev postgresql-server-dev-15 postgresql-15-cron
               postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl"
    [release]="debhelper devscripts dpkg-dev fakeroot lintian postgresql-server-dev-all pgxnclient
               python3-build python3-venv python3-setuptools python3-wheel prometheus prometheus-postgres-exporter"
    [pg-build]="build-essential dpkg-dev curl gnupg debian-archive-keyring perl libipc-run-perl pkg-config
                postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl"
    [pg-build-grammar]="bison flex"
    [debian-keyring]="debian-keyring"
)
# PACKAGE:COMMAND: the package is not needed when COMMAND is on the PATH (a Node.js installed otherwise, whose
# npm would conflict with Debian's).
# A group that needs another group's packages too.
declare -A includes=([bench]="clients valgrind")

list_only=0
if [ "${1:-}" = --list ]; then
    list_only=1
    shift
fi
wanted=("$@")
[ ${#wanted[@]} -eq 0 ] && wanted=(core tests)

packages=()
add_group() {
    local group=$1 more
    if [ -z "${groups[$group]+set}" ]; then
        echo "install-deps.sh: unknown group '$group' (groups: ${!groups[*]})" >&2
        exit 2
    fi
    # shellcheck disable=SC2206  # the lists are plain words
    packages+=(${groups[$group]})
    for more in ${includes[$group]:-}; do add_group "$more"; done
}
for group in "${wanted[@]}"; do add_group "$group"; done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)

if [ "$list_only" = 1 ]; then
    printf '%s\n' "${packages[@]%%:*}"
    exit 0
fi

missing=()
for entry in "${packages[@]}"; do
    package=${entry%%:*}
    [ "$package" != "$entry" ] && command -v "${entry#*:}" >/dev/null && continue
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps.sh: missing packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=900 "$@"; }
# The package lists may be missing or stale on a fresh machine: install, and update only when that fails.
apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt_get update -qq && apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
# Installing postgresql-15 starts Debian's own cluster on port 5432; the tests and the demo start their own.
