"""bench/gpu_check.sh and its helpers on a machine without a GPU: --cpu-only runs every
step but the GPU ones and leaves the folder, the tarball and the summary; without
--cpu-only the missing GPU fails the check loudly; the summary reads real pytest JUnit
output; bench/gpu_vs_cpu_ops.py's error arithmetic and its generated nets."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from placer.formats import load_net
from placer.ops import registry

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
GPU_STEPS = ("profile_gpu_dlrm_small", "profile_gpu_resnet_small", "link", "kernel_check", "link_compare")


def bench_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_check(out: Path, *flags: str, budget_s: int = 420, nets: str = "resnet_small"):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_BUDGET_S": str(budget_s),
           "GPU_CHECK_NETS": nets}
    return subprocess.run(["bash", str(SCRIPT), *flags, str(out)], capture_output=True, text=True,
                          env=env, timeout=budget_s + 120)


def steps_of(out: Path) -> dict[str, dict]:
    with open(out / "steps.tsv", newline="") as f:
        return {row["step"]: row for row in csv.DictReader(f, delimiter="\t")}


@pytest.mark.slow
def test_cpu_only_run_leaves_folder_tarball_and_summary(tmp_path):
    out = tmp_path / "check"
    proc = run_check(out, "--cpu-only")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    steps = steps_of(out)
    assert {n: r["status"] for n, r in steps.items()} == {
        "env": "ok", "gpu": "skipped", "gpu_tests": "ok", **{n: "skipped" for n in GPU_STEPS},
        "profile_cpu_dlrm_small": "ok", "profile_cpu_resnet_small": "ok", "ops_resnet_small": "ok",
        "plan": "ok"}
    summary = (out / "summary.txt").read_text()
    assert summary.strip() in proc.stdout                       # printed at the end
    assert "result: PASSED (GPU steps skipped: --cpu-only)" in summary
    assert "GPU tests (pytest -m gpu): 0 passed, 0 failed," in summary
    assert "plan of dlrm_small with the datasheet GPU profile (NVIDIA H200 141 GB): mincut" in summary
    # the per-op step ran on the emulated GPU: every op of the net, same outputs on both sides
    net = load_net(ROOT / "placer" / "examples" / "data" / "resnet_small.pbtxt")
    ops = json.loads((out / "ops_resnet_small.json").read_text())
    assert ops["emulated"] and ops["ops"] == len(net.ops) and ops["max_abs_diff"] == 0.0
    assert ops["ops_on_gpu"] == sum("gpu" in registry.get(op.type).devices for op in net.ops)
    with open(out / "ops_resnet_small.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["type"] for r in rows] == [op.type for op in net.ops]
    assert all(float(r["pred_h200-141gb-pcie5_s"]) > 0 for r in rows)
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"check/summary.txt", "check/steps.tsv", "check/gpu_tests.xml", "check/cpu_profile.json",
            "check/ops_resnet_small.csv", "check/plan_dlrm_small.json", "check/plan_dlrm_small.html"} <= names
    assert not any(".venv" in n or n.endswith(".tar.gz") for n in names)


def test_without_a_gpu_the_gpu_check_fails_and_still_reports(tmp_path):
    """A budget that leaves time for almost nothing: the steps still all report, and the
    GPU steps fail (there is no GPU here) instead of skipping."""
    out = tmp_path / "check"
    proc = run_check(out, budget_s=32)
    assert proc.returncode == 1
    steps = steps_of(out)
    assert steps["gpu"]["status"] in ("failed", "no-time")
    for name in GPU_STEPS + ("ops_resnet_small",):
        assert steps[name]["status"] == "failed", steps[name]
    assert set(steps) >= {"env", "gpu_tests", "profile_cpu_dlrm_small", "plan"}
    summary = (out / "summary.txt").read_text()
    assert "result: FAILED (" in summary and "link_compare" in summary
    assert (out / "gpu_check.tar.gz").stat().st_size > 0


def test_bad_usage_exits_2():
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_summary_counts_real_junit_output(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "import pytest\n"
        "def test_pass():\n    assert True\n"
        "def test_fail():\n    assert False\n"
        "def test_skip():\n    pytest.skip('no widget here')\n")
    xml = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                    str(tmp_path / "test_three.py")], capture_output=True, cwd=tmp_path, timeout=120)
    counts = bench_module("gpu_check_summary").junit_counts(xml)
    assert counts == {"passed": 1, "failed": 1, "skipped": 1, "reasons": {"no widget here": 1}}


def test_prediction_errors_per_op_and_per_net():
    rows = [{"index": 0, "type": "FC", "name": "a", "device": "cuda:0", "gpu_s": 1e-3, "pred_p_s": 2e-3},
            {"index": 1, "type": "Relu", "name": "b", "device": "cuda:0", "gpu_s": 2e-3, "pred_p_s": 1e-3},
            {"index": 2, "type": "Gather", "name": "c", "device": "cpu", "gpu_s": 5e-3, "pred_p_s": 9.0}]
    stats = bench_module("gpu_vs_cpu_ops").error_stats(rows, "p")
    assert stats["ops"] == 2                                   # the op left on the CPU does not count
    assert stats["net_error_pct"] == pytest.approx(0.0)        # 3 ms predicted for 3 ms measured
    assert stats["median_abs_op_error_pct"] == pytest.approx(75.0)   # |+100%| and |-50%|
    assert stats["worst_ops"][0]["op"] == "#0 FC a"


@pytest.mark.parametrize("name,inputs", [
    ("resnet18_b8", {"data": (8, 3, 224, 224)}),
    ("dlrm_b2048", {"dense_in": (2048, 13), "emb:::sls0_i": (2048,)}),
])
def test_generated_nets_need_nothing_but_the_repository(tmp_path, name, inputs):
    path = bench_module("gpu_vs_cpu_ops").resolve_net(name, tmp_path, None)
    net = load_net(path)
    for blob, shape in inputs.items():
        assert net.input_shapes[blob].shape == shape
