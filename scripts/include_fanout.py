#!/usr/bin/env python3
"""Include fan-out of kiln's headers: how many translation units depend on each one.

A header's fan-out is the number of translation units (.cc, .cu) under src/, tests/,
bench/, fuzz/ and examples/ that include it, directly or through other headers. It is
what one edit to that header costs in recompiles.

  include_fanout.py [--root DIR] [--top N]          the N headers with the most dependents
  include_fanout.py --check BUDGETS [--root DIR]    exit 1 when a header in BUDGETS has
                                                    more dependents than its budget

BUDGETS (cmake/include_budgets.txt): one `header budget` pair a line, `#` comments.
Only project headers are followed ("..." includes resolved against the including
file's directory, then include/); system and generated headers are leaves.
"""
import argparse
import os
import re
import sys

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
TU_DIRS = ("src", "tests", "bench", "fuzz", "examples")
TU_EXT = (".cc", ".cu", ".cpp")
HDR_EXT = (".h", ".hpp", ".cuh", ".inc")


def scan(root):
    files = {}
    for top in ("include",) + TU_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith(TU_EXT + HDR_EXT):
                    p = os.path.relpath(os.path.join(dirpath, n), root)
                    files[p] = None
    include_root = "include"
    deps = {}
    for p in files:
        with open(os.path.join(root, p), encoding="utf-8", errors="replace") as f:
            text = f.read()
        out = []
        for inc in INCLUDE_RE.findall(text):
            for cand in (os.path.normpath(os.path.join(os.path.dirname(p), inc)),
                         os.path.normpath(os.path.join(include_root, inc)),
                         os.path.normpath(os.path.join("src", inc))):
                if cand in files:
                    out.append(cand)
                    break
        deps[p] = out
    return deps


def closure(deps):
    memo = {}

    def visit(p, stack):
        if p in memo:
            return memo[p]
        if p in stack:  # include cycle (guarded by #pragma once): stop here
            return set()
        stack.add(p)
        s = set()
        for d in deps.get(p, ()):
            s.add(d)
            s |= visit(d, stack)
        stack.discard(p)
        memo[p] = s
        return s

    return {p: visit(p, set()) for p in deps}


def fanout(root):
    deps = scan(root)
    cl = closure(deps)
    tus = [p for p in deps if p.endswith(TU_EXT) and p.split(os.sep)[0] in TU_DIRS]
    count = {}
    for tu in tus:
        for h in cl[tu]:
            count[h] = count.get(h, 0) + 1
    return count, len(tus)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--check", metavar="BUDGETS")
    args = ap.parse_args()
    count, ntu = fanout(args.root)
    if not args.check:
        print(f"{ntu} translation units")
        for h, n in sorted(count.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{n:5d}  {h}")
        return 0
    failed = 0
    checked = 0
    with open(args.check, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                print(f"{args.check}:{lineno}: expected 'header budget', got {line!r}")
                return 2
            header, budget = parts[0], int(parts[1])
            if not os.path.exists(os.path.join(args.root, header)):
                print(f"{args.check}:{lineno}: {header} does not exist (moved? update the budget file)")
                failed += 1
                continue
            n = count.get(header, 0)
            checked += 1
            status = "ok" if n <= budget else "OVER BUDGET"
            print(f"{status:12s} {n:4d} / {budget:4d}  {header}")
            if n > budget:
                failed += 1
    print(f"{ntu} translation units; {checked} headers checked, {failed} over budget or missing")
    if failed:
        print("A header's fan-out grew: include the narrower header it needs (see docs/architecture.md, "
              "'Headers and build cost'), or raise the budget in the same commit with the reason.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
