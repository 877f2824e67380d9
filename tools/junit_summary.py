#!/usr/bin/env python3
"""Adds up JUnit XML reports (ctest, pytest, fuzz) into one closing line:
'total: N passed, N failed, N skipped'. Exits 1 when any test failed or errored."""
import sys
import xml.etree.ElementTree as ET


def count(path):
    passed = failed = skipped = 0
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main(paths):
    totals = [0, 0, 0]
    for path in paths:
        try:
            p, f, s = count(path)
        except (OSError, ET.ParseError) as err:
            print(f"{path}: unreadable report ({err})")
            totals[1] += 1
            continue
        print(f"{path}: {p} passed, {f} failed, {s} skipped")
        totals = [totals[0] + p, totals[1] + f, totals[2] + s]
    print(f"total: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
