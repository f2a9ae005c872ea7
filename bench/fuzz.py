"""Put hostile input through the command line and count what happens.

    python bench/fuzz.py [--mutations 400] [--scale 20000] [--seed N] [--time-cap 30]
                         [--mem-cap-gib 2] [--only SUBSTRING] [--show 10]

Every case (see tests/fuzz_cases.py: mutated corpus nets, crafted hostile nets, bad
options, bad profile JSON, every JSON document placer reads made hostile, four wrong
values per field) runs through ``placer.cli.main`` in a worker process under an
address-space cap and a time cap. Prints the count per outcome, every case that broke
the contract (exit 0, or exit 2 with one line on stderr, no traceback and nothing
written) with the end of its traceback, and the slowest cases. Exit status 1 when any
case broke it.

The same seed gives the same cases anywhere; times depend on the host (label them).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fuzz_cases import SEED, CliRunner, all_cases  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutations", type=int, default=400, help="mutated corpus nets (default 400)")
    ap.add_argument("--scale", type=int, default=20000, help="ops of the long chain / inputs of the wide Sum")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--time-cap", type=float, default=30.0, help="seconds per case (default 30)")
    ap.add_argument("--mem-cap-gib", type=float, default=2.0, help="address-space cap of the worker (GiB)")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--show", type=int, default=10, help="slowest cases to list")
    args = ap.parse_args()

    cases = all_cases(args.mutations, args.scale, args.seed)
    if args.only:
        cases = [c for c in cases if args.only in c.name]
    outcomes = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="placer-fuzz-") as tmp, \
            CliRunner(Path(tmp), int(args.mem_cap_gib * 2**30), args.time_cap) as runner:
        for i, case in enumerate(cases):
            outcomes.append(runner.run(case))
            if sys.stderr.isatty():
                print(f"\r{i + 1}/{len(cases)}", end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    wall = time.perf_counter() - start

    counts = Counter(o.kind for o in outcomes)
    print(f"{len(outcomes)} cases in {wall:.1f} s (seed {args.seed}, time cap {args.time_cap:g} s, "
          f"memory cap {args.mem_cap_gib:g} GiB)")
    for kind, n in counts.most_common():
        print(f"  {kind:<10} {n}")
    broken = [o for o in outcomes if not o.accepted]
    for o in broken:
        tail = (o.detail or o.stderr).strip().splitlines()[-3:]
        print(f"\nBROKEN [{o.kind}] {o.case.name}: placer {' '.join(o.case.argv)[:200]}")
        for line in tail:
            print(f"    {line[:300]}")
    print(f"\nslowest {args.show}:")
    for o in sorted(outcomes, key=lambda o: -o.seconds)[:args.show]:
        print(f"  {o.seconds:7.2f} s  {o.kind:<8} {o.case.name}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
