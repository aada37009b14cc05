#!/bin/sh
# Tests of the Java client: JUnit 5 through Maven Surefire, built offline against Debian's Maven repository
# (settings.xml: /usr/share/maven-repo; the packages of scripts/install-deps.sh java, installed when run as root).
# `mvn -o package` builds the filter's jar (its tests run first) and the sample service's, which depends on it.
# The database tests run when IDEM_TEST_DATABASE_URL is exported (a libpq URI of a database with the extension and
# clients/schema.sql, e.g. postgresql://postgres@127.0.0.1:55470/javatest); otherwise they are skipped.
# Ends with "clients/java: N passed, N failed" (Surefire's own count, from its XML reports; errors count as failed)
# and exits non-zero on any failure.
set -eu
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
"$root/scripts/install-deps.sh" java

if [ -n "${IDEM_TEST_DATABASE_URL:-}" ]; then
    echo "test.sh: database tests against $IDEM_TEST_DATABASE_URL"
else
    echo "test.sh: IDEM_TEST_DATABASE_URL is not set, the database tests are skipped"
fi
rm -rf idempotency/target/surefire-reports
set +e
mvn -B -o -s settings.xml -Dstyle.color=never package "$@"
rc=$?
set -e
passed=0 failed=0
for report in idempotency/target/surefire-reports/TEST-*.xml; do
    [ -f "$report" ] || continue
    # shellcheck disable=SC2046  # three numbers
    set -- $(/usr/bin/python3 "$root/scripts/lib/counts.py" junit "$report")
    passed=$((passed + $1)) failed=$((failed + $2))
done
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
# on a line of its own (Maven's console library ends its output with a colour reset and no newline)
printf '\nclients/java: %s passed, %s failed\n' "$passed" "$failed"
exit "$rc"
