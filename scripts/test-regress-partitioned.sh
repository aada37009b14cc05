#!/usr/bin/env bash
# The pg_regress files (sql/*.sql) again, with the database's storage partitioned, once per partition width (1 day,
# the default, and 1 hour: 5 and 28 partitions, issue 39's two widths): before each file,
# test/regress-partitioned/to_partitioned.sql switches the storage to partitioned (idem_set_storage) unless it is
# partitioned already, so every file starts in partitioned storage whatever the one before it left (some set the
# storage themselves). Each file is compared with expected/NAME.out, or with
# test/regress-partitioned/expected/NAME.out where its output shows the storage (it reads the key table by name
# and the rows show the storage); the files listed in test/regress-partitioned/SKIP do not run, each with its
# reason.
#
# Runs against the server in the libpq environment (PGHOST, PGPORT, PGUSER), which preloads the library, in a
# database of its own (contrib_regression_partitioned); PG_CONFIG picks the PostgreSQL (default pg_config).
# Prints "regress-partitioned-1d N passed, N failed" and "regress-partitioned-1h ..." and exits non-zero on any
# failure; the diffs are printed. IDEM_KEEP_WORK=1 keeps the work directories (/tmp/idem-regress-partitioned.*).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
pg_config=${PG_CONFIG:-pg_config}
pg_regress=$(dirname "$("$pg_config" --pgxs)")/../../src/test/regress/pg_regress
works=()
trap '[ -n "${IDEM_KEEP_WORK:-}" ] || rm -rf "${works[@]}"' EXIT

# The files read and write the key table by name: here they name the partitioned one. Their expected output
# echoes the same text, so it is rewritten alike; the rows and answers must then be the table pass's own.
to_partitioned_table='s/\<idempotency_keys\>([^_]|$)/idempotency_keys_partitioned\1/g'

# pass SUITE WIDTH: every file of sql/ but the skipped ones, in partitions of WIDTH.
pass() {
    local suite=$1 width=$2 work name file tests=0 status failures bad
    work=$(mktemp -d /tmp/idem-regress-partitioned.XXXXXX)
    works+=("$work")
    chmod 755 "$work"
    mkdir -p "$work/sql" "$work/expected"
    ln -s "$root/sql/include" "$work/sql/include"
    # The width of this pass in place of to_partitioned's 1 day, in the file and in its expected output alike.
    sed "s/interval '1 day'/interval '$width'/" test/regress-partitioned/to_partitioned.sql >"$work/sql/to_partitioned.sql"
    sed "s/interval '1 day'/interval '$width'/" test/regress-partitioned/to_partitioned.out >"$work/expected/to_partitioned.out"
    : >"$work/schedule"
    for file in sql/*.sql; do
        name=$(basename "$file" .sql)
        if grep -q "^$name:" test/regress-partitioned/SKIP; then
            echo "$suite: $name skipped:$(grep "^$name:" test/regress-partitioned/SKIP | cut -d: -f2-)"
            continue
        fi
        sed -E "$to_partitioned_table" "$file" >"$work/sql/$name.sql"
        if [ -f "test/regress-partitioned/expected/$name.out" ]; then
            cp "test/regress-partitioned/expected/$name.out" "$work/expected/$name.out"
        else
            sed -E "$to_partitioned_table" "expected/$name.out" >"$work/expected/$name.out"
        fi
        printf 'test: to_partitioned\ntest: %s\n' "$name" >>"$work/schedule"
        tests=$((tests + 1))
    done

    "$pg_regress" --inputdir="$work" --outputdir="$work" --bindir="$("$pg_config" --bindir)" \
        --load-extension=idempotency --dbname=contrib_regression_partitioned --schedule="$work/schedule" 2>&1 \
        | tee "$work/log"
    status=${PIPESTATUS[0]}
    [ -f "$work/regression.diffs" ] && cat "$work/regression.diffs"
    # Count the files of sql/ only; to_partitioned runs before each of them, and any failure of it counts once.
    failures=$(grep -E '\.\.\. +FAILED|^not ok' "$work/log")
    bad=0
    if [ -n "$failures" ]; then
        bad=$(grep -vc to_partitioned <<<"$failures")
        grep -q to_partitioned <<<"$failures" && bad=$((bad + 1))
    fi
    [ "$status" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    echo "$suite $((tests - bad > 0 ? tests - bad : 0)) passed, $bad failed"
    [ "$status" -eq 0 ] && [ "$bad" -eq 0 ]
}

failed=0
pass regress-partitioned-1d '1 day' || failed=1
pass regress-partitioned-1h '1 hour' || failed=1
exit $failed
