#!/usr/bin/env python3
"""Restates the failed tests of a ctest log at its end.

CI shows only the tail of what scripts/test.sh prints; ctest prints a failed test's output
where it failed, often thousands of lines above. Given the logs ctest's output was copied
to, this prints each failed test's result line and the last lines of its output.

  scripts/ctest-failures.py LOG [LOG ...]
"""
import re
import sys

RESULT = re.compile(r"^\s*\d+/\d+ Test +#\d+: (\S+) \.+\s*(.*)$")
START = re.compile(r"^\s+Start +\d+: ")
TAIL_LINES = 60


def failures(lines):
    """Yields (result line, output lines) for every test whose result is not Passed."""
    i = 0
    while i < len(lines):
        m = RESULT.match(lines[i])
        if not m or m.group(2).startswith("Passed") or "Not Run" in m.group(2) or \
                "Skipped" in m.group(2):
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not RESULT.match(lines[j]) and not START.match(lines[j]):
            j += 1
        yield lines[i].rstrip(), [l.rstrip() for l in lines[i + 1:j]]
        i = j


def main(paths):
    found = 0
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except OSError as e:
            print(f"ctest-failures: cannot read {path}: {e}")
            continue
        for result, output in failures(lines):
            found += 1
            print(f"== {path}: {result.strip()}")
            if len(output) > TAIL_LINES:
                print(f"   ... ({len(output) - TAIL_LINES} lines above left out)")
            for line in output[-TAIL_LINES:]:
                print("   " + line)
    if not found:
        print("ctest-failures: no failed test in " + ", ".join(paths))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
