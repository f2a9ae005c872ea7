"""Plans of the corpus nets on the CPU + one GPU machine, as a reference to compare against.

    python bench/corpus_plans.py OUT.json     # plan every case, write {case: {total_s, kinds}}

For each case of tests/test_placed_corpus.py (the runnable corpus nets and the bundled
examples, batch 1, the default host and V100 profiles), ``placer plan --json`` gives the
serial total and the kind of device ("cpu"/"gpu") of every op. tests/data/
corpus_plans_cpu_gpu.json holds these figures (first as the two-device planner made them,
rewritten once when the GPU kernel model replaced the datasheet roofline);
tests/test_corpus_plans.py checks that today's planner, on the same machine, makes the
same placements at the same totals.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def plan_case(name: str) -> dict:
    from test_placed_corpus import CASES, resolve
    from placer import cli
    path, init, inputs, _ = CASES[name]
    argv = ["plan", str(resolve(path)), "--json", "--stability-draws", "0"]
    if init:
        argv += ["--init-net", str(resolve(init))]
    for spec in inputs:
        argv += ["--input", spec]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main(argv)
    if rc != 0:
        raise SystemExit(f"{name}: placer plan exited {rc}")
    doc = json.loads(out.getvalue())
    return {"total_s": doc["total_s"],
            "kinds": "".join(("g" if o.get("device_kind", o["device"]) == "gpu" else "c") for o in doc["ops"])}


def main(out: str) -> None:
    from test_placed_corpus import CASES
    plans = {name: plan_case(name) for name in CASES}
    Path(out).write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n")
    for name, p in plans.items():
        print(f"{name:24} {p['total_s'] * 1e3:10.4f} ms  {p['kinds'].count('g')}/{len(p['kinds'])} ops on the GPU")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "corpus_plans.json")
