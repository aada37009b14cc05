# Counting of suite results for the test scripts; source this file.
# The caller sets log_dir (a directory for the logs and the summary) and may set COUNT_FORMAT, the printf format
# of one summary line (suite, passed, failed). Totals add up in $passed and $failed.
passed=${passed:-0}
failed=${failed:-0}
COUNT_FORMAT=${COUNT_FORMAT:-'%-12s %4d passed, %d failed\n'}

count() {  # count SUITE PASSED FAILED
    # shellcheck disable=SC2059
    printf "$COUNT_FORMAT" "$1" "$2" "$3" >>"$log_dir/summary"
    passed=$((passed + $2))
    failed=$((failed + $3))
}

# A suite that prints gtest summaries.
run_gtest_suite() {
    local name=$1
    shift
    "$@" 2>&1 | tee "$log_dir/$name.log"
    local status=${PIPESTATUS[0]}
    local ok bad
    ok=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log_dir/$name.log" | awk '{s+=$4} END {print s+0}')
    bad=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$log_dir/$name.log" | awk '{s+=$4} END {print s+0}')
    [ "$status" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    count "$name" "$ok" "$bad"
}

# A suite judged as one test by its exit status.
run_single() {
    local name=$1
    shift
    if "$@" 2>&1 | tee "$log_dir/$name.log"; then count "$name" 1 0; else count "$name" 0 1; fi
}

# pg_regress and pg_isolation_regress print "All N tests passed." or "M of N tests failed."
# (17 and later print "# All N tests passed." and "# M of N tests failed.")
count_regress() {
    local name=$1 file=$2 status=$3 all bad
    all=$(grep -Eo 'All [0-9]+ tests passed|[0-9]+ of [0-9]+ tests failed' "$file" | tail -1)
    if [[ $all =~ ^All\ ([0-9]+) ]]; then
        count "$name" "${BASH_REMATCH[1]}" 0
    elif [[ $all =~ ^([0-9]+)\ of\ ([0-9]+) ]]; then
        count "$name" $((BASH_REMATCH[2] - BASH_REMATCH[1])) "${BASH_REMATCH[1]}"
    else
        count "$name" 0 1
    fi
}

# TAP from pg_prove or prove -v: one count per assertion.
count_tap() {
    local name=$1 file=$2 status=$3 ok bad
    ok=$(grep -Ec '^ *ok [0-9]+' "$file")
    bad=$(grep -Ec '^ *not ok [0-9]+' "$file")
    # A failed run, or one that ran no assertion at all, counts as a failure.
    [ "$status" -ne 0 ] || [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ] && bad=1
    count "$name" "$ok" "$bad"
}
