#!/usr/bin/env python3
"""Which global loads of the dependent kernels come before their wait on the kernel before.

Reads `cuobjdump -sass <binary>` on stdin. In SASS, griddepcontrol.wait is ACQBULK. For each
kernel that has one, counts the global loads issued before it: non-coherent ones
(LDG...CONSTANT: __ldg, const __restrict__) may legitimately fetch weights and tables no kernel
writes; anything an earlier kernel of the step writes must come after the wait
(dependent_launch.cuh). Coherent loads (LDG without CONSTANT) before the wait are listed for
review: the decode attention's early reads of the step's inputs (lengths, flags, which no kernel
of the step writes) belong there; anything else would read an earlier kernel's output too early.
"""
import re
import sys
from collections import defaultdict


def kernels(lines):
    name, body = None, []
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
        elif name:
            body.append(line)
    if name:
        yield name, body


def main():
    summary = defaultdict(lambda: [0, 0, 0])  # short name -> [kernels, nc before, coherent before]
    suspects = []
    for name, body in kernels(sys.stdin):
        wait = next((i for i, l in enumerate(body) if "ACQBULK" in l), None)
        if wait is None:
            continue
        before = [l for l in body[:wait] if re.search(r"\bLDG\.", l)]
        nc = sum("CONSTANT" in l for l in before)
        coherent = [l.strip() for l in before if "CONSTANT" not in l]
        short = re.sub(r"^_ZN.*?(\d+)([a-z_0-9]+_kernel).*$", r"\2", name)
        s = summary[short]
        s[0] += 1
        s[1] += nc
        s[2] += len(coherent)
        if coherent:
            suspects.append((name, coherent[:4]))
    print(f"{'kernel':50s} {'instances':>9s} {'nc loads before wait':>21s} {'coherent before':>16s}")
    for short, (n, nc, co) in sorted(summary.items()):
        print(f"{short[:50]:50s} {n:9d} {nc:21d} {co:16d}")
    for name, lines in suspects:
        print("REVIEW", name[:120])
        for l in lines:
            print("   ", l[:140])
    return 0


if __name__ == "__main__":
    sys.exit(main())
