"""The held-out nets of bench/cost_accuracy.py: ResNet-101 written from the ResNet-50
prototxt has the published size (He et al. 2016, table 1: 7.6 G multiply-adds)."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytestmark = pytest.mark.corpus


def test_resnet101_has_23_stage4_blocks_and_the_published_size(corpus):
    from accuracy_nets import resnet101
    typed = resnet101(1)
    types = Counter(op.type for op in typed.net.ops)
    # 1 stem conv + 3 per bottleneck block x (3 + 4 + 23 + 3) + 4 projection shortcuts
    assert types["Conv"] == 1 + 3 * 33 + 4 and types["Sum"] == 33 and types["FC"] == 1
    assert not typed.missing
    gmacs = sum(f.macs for f in typed.features) / 1e9
    assert gmacs == pytest.approx(7.6, rel=0.01)
    names = [op.name for op in typed.net.ops if op.type == "Conv"]
    assert len(set(names)) == len(names) and "res4b22_branch2c" in names and "res4c_branch2a" not in names
