# Counting of suite results for scripts/test.sh and scripts/test-versions.sh; source this file (bash).
# The caller sets log_dir (a directory for the logs and the summary) and may set COUNT_FORMAT, the printf format
# of one summary line (suite, passed, failed). Totals add up in $passed and $failed.
#
# Every suite is judged by its exit status first, then by its own count of assertions:
#   - a suite that exits non-zero has at least one failure, whatever its output says;
#   - a suite that exits zero but counted no assertion at all is one failure (it tested nothing).
# Only the count comes from the suite's output, in the format its tool documents: GoogleTest's summary lines,
# pg_regress's last line, TAP's "ok"/"not ok", or this project's own "<suite> N passed, N failed".
passed=${passed:-0}
failed=${failed:-0}
COUNT_FORMAT=${COUNT_FORMAT:-'%-12s %4d passed, %d failed\n'}

count() {  # count SUITE PASSED FAILED: records the numbers as they are
    # shellcheck disable=SC2059
    printf "$COUNT_FORMAT" "$1" "$2" "$3" >>"$log_dir/summary"
    passed=$((passed + $2))
    failed=$((failed + $3))
}

judge() {  # judge SUITE EXIT_STATUS PASSED FAILED: count, with the two rules above
    local name=$1 status=$2 ok=${3:-0} bad=${4:-0}
    if [ "$bad" -eq 0 ] && { [ "$status" -ne 0 ] || [ "$ok" -eq 0 ]; }; then
        bad=1
    fi
    count "$name" "$ok" "$bad"
}

# run_single SUITE COMMAND...: a suite that is one test, judged by its exit status.
run_single() {
    local name=$1
    shift
    "$@" 2>&1 | tee "$log_dir/$name.log"
    if [ "${PIPESTATUS[0]}" -eq 0 ]; then count "$name" 1 0; else count "$name" 0 1; fi
}

# run_gtest_suite SUITE COMMAND...: GoogleTest binaries; each prints "[  PASSED  ] N tests." and, on failure,
# "[  FAILED  ] N tests, listed below".
run_gtest_suite() {
    local name=$1 status ok bad
    shift
    "$@" 2>&1 | tee "$log_dir/$name.log"
    status=${PIPESTATUS[0]}
    ok=$(awk '/^\[  PASSED  \] [0-9]+ test/ {s += $4} END {print s + 0}' "$log_dir/$name.log")
    bad=$(awk '/^\[  FAILED  \] [0-9]+ test/ {s += $4} END {print s + 0}' "$log_dir/$name.log")
    judge "$name" "$status" "$ok" "$bad"
}

# count_regress SUITE LOG EXIT_STATUS: pg_regress and pg_isolation_regress end with "All N tests passed." or
# "M of N tests failed." (17 and later put "# " in front).
count_regress() {
    local name=$1 file=$2 status=$3 last ok=0 bad=0
    last=$(grep -Eo 'All [0-9]+ tests passed|[0-9]+ of [0-9]+ tests failed' "$file" | tail -1)
    if [[ $last =~ ^All\ ([0-9]+) ]]; then
        ok=${BASH_REMATCH[1]}
    elif [[ $last =~ ^([0-9]+)\ of\ ([0-9]+) ]]; then
        ok=$((BASH_REMATCH[2] - BASH_REMATCH[1])) bad=${BASH_REMATCH[1]}
    fi
    judge "$name" "$status" "$ok" "$bad"
}

# count_tap SUITE LOG EXIT_STATUS: TAP from pg_prove -v or prove -v, one count per assertion (subtests indented).
count_tap() {
    local name=$1 file=$2 status=$3
    judge "$name" "$status" "$(grep -Ec '^ *ok [0-9]+' "$file")" "$(grep -Ec '^ *not ok [0-9]+' "$file")"
}

# run_counted_suites NAME COMMAND...: a command that runs suites of this project and prints one line per suite,
# "<suite> N passed, N failed" (clients/run-tests.sh, scripts/test-versions.sh). Each line is counted as it is;
# a run that printed no such line, or exited non-zero without a failing line, adds one failure under NAME.
run_counted_suites() {
    local name=$1 log=$log_dir/$1.log status suite ok bad lines=0 failing=0
    shift
    "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    # A suite that cannot run here (scripts/test-citus.sh without its tarball) exits 3 after printing
    # "<suite> SKIPPED: <reason>": the line goes into the summary, counted neither as passed nor as failed.
    if [ "$status" -eq 3 ] && grep -Eq '^[a-z0-9-]+ SKIPPED: ' "$log"; then
        grep -E '^[a-z0-9-]+ SKIPPED: ' "$log" >>"$log_dir/summary"
        return
    fi
    while read -r suite ok _ bad _; do
        count "$suite" "$ok" "$bad"
        lines=$((lines + 1))
        [ "$bad" -gt 0 ] && failing=$((failing + 1))
    done < <(grep -E '^[a-z0-9-]+ [0-9]+ passed, [0-9]+ failed$' "$log")
    if [ "$lines" -eq 0 ] || { [ "$status" -ne 0 ] && [ "$failing" -eq 0 ]; }; then
        count "$name" 0 1
    fi
}
