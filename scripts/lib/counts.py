"""A test tool's own count of its tests, from its machine-readable output, for the suites' scripts.

    python3 counts.py junit FILE             pytest --junitxml FILE: prints "PASSED FAILED SKIPPED"
    python3 counts.py go-json COUNT_FILE     go test -json on stdin: prints the tests' text (what go test -v
                                             prints) as it comes, writes "PASSED FAILED SKIPPED" to COUNT_FILE
    python3 counts.py node-tap FILE          node --test's TAP reporter: prints "PASSED FAILED SKIPPED" from its
                                             closing "# pass N", "# fail N", "# skipped N" lines

FAILED counts errors too (pytest's errors in fixtures, a Go package that does not build, node's cancelled
tests). A suite is judged by its exit status first (scripts/lib/count.sh's rules); these are only the numbers.
"""

import json
import re
import sys
import xml.etree.ElementTree as ElementTree


def junit(path):
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
    passed = failed = skipped = 0
    for s in suites:
        tests, skips = int(s.get("tests", 0)), int(s.get("skipped", 0))
        bad = int(s.get("failures", 0)) + int(s.get("errors", 0))
        passed += tests - bad - skips
        failed += bad
        skipped += skips
    return passed, failed, skipped


def go_json(count_file, lines=sys.stdin):
    """One count per test and subtest, as go test -v's "--- PASS" lines; a package that fails without a failing
    test (a build error, a panic outside a test) is one failure more."""
    passed = failed = skipped = 0
    failed_tests = set()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            sys.stdout.write(line)  # go's own messages before the JSON stream (a build failure)
            continue
        sys.stdout.write(event.get("Output", ""))
        action, test, package = event.get("Action"), event.get("Test"), event.get("Package")
        if action == "pass" and test:
            passed += 1
        elif action == "skip" and test:
            skipped += 1
        elif action == "fail" and test:
            failed += 1
            failed_tests.add(package)
        elif action == "fail" and package not in failed_tests:
            failed += 1
    sys.stdout.flush()
    with open(count_file, "w") as f:
        f.write(f"{passed} {failed} {skipped}\n")


def node_tap(path):
    found = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", line.rstrip("\n"))
            if m:
                found[m.group(1)] = int(m.group(2))
    return found.get("pass", 0), found.get("fail", 0) + found.get("cancelled", 0), found.get("skipped", 0)


def main(argv):
    if len(argv) == 2 and argv[0] == "junit":
        print(*junit(argv[1]))
    elif len(argv) == 2 and argv[0] == "go-json":
        go_json(argv[1])
    elif len(argv) == 2 and argv[0] == "node-tap":
        print(*node_tap(argv[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
