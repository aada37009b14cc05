#!/usr/bin/env python3
"""A pg_regress result of the managed edition as the C edition would print it: the CONTEXT lines that name the
managed edition's own functions (PL/pgSQL and SQL functions idem_*, and the one-line SQL statements they ran)
are dropped, since a C function adds none. Every other line, CONTEXT lines of the test's own functions included,
stays as it is. Prints the filtered file to stdout.
  managed/regress-filter.py results/NAME.out
"""
import re
import sys

OWN = re.compile(r'^(CONTEXT:  )?(PL/pgSQL function (\w+\.)?idem_\w+\(.*\) (line \d+ at .*|while .*)'
                 r'|SQL function "idem_\w+"( statement \d+| during startup| during inlining)?)$')
STATEMENT = re.compile(r'^(CONTEXT:  )?SQL statement ".*"$')

lines = open(sys.argv[1], encoding="utf-8", errors="surrogateescape").read().split("\n")
out = []
carry = False  # the dropped line held the "CONTEXT:  " prefix: the next frame kept takes it
i = 0
while i < len(lines):
    line = lines[i]
    own = OWN.match(line)
    # A one-line SQL statement directly followed by a frame of ours is that function's own statement.
    if not own and STATEMENT.match(line) and i + 1 < len(lines) and OWN.match(lines[i + 1]):
        own = STATEMENT.match(line)
    if own:
        carry = carry or line.startswith("CONTEXT:  ")
        i += 1
        continue
    if carry:
        if re.match(r'^(PL/pgSQL function |SQL function |SQL statement |JSON data)', line):
            line = "CONTEXT:  " + line
        carry = False
    out.append(line)
    i += 1
sys.stdout.write("\n".join(out))
