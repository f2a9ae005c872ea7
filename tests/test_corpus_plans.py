"""On the CPU + one GPU machine, plans of the corpus nets are those of the two-device planner.

tests/data/corpus_plans_cpu_gpu.json was first written by bench/corpus_plans.py with the
planner that placed over exactly one CPU and one GPU, and the planner for any number of
devices reproduced it on that machine. It was rewritten by the same script when the GPU
kernel model replaced the datasheet roofline (GPU op times changed; the planner did not):
the placements and serial totals of today's planner must stay those.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import corpus_dir

from test_placed_corpus import CASES

import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from corpus_plans import plan_case  # noqa: E402

REFERENCE = json.loads((Path(__file__).parent / "data" / "corpus_plans_cpu_gpu.json").read_text())

pytestmark = [pytest.mark.corpus, pytest.mark.slow]


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_device_plans_are_unchanged(name):
    corpus_dir()
    want, got = REFERENCE[name], plan_case(name)
    assert got["kinds"] == want["kinds"]
    assert got["total_s"] == pytest.approx(want["total_s"], rel=1e-9)
