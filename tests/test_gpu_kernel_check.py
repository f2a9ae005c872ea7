"""bench/gpu_kernel_check.py without a GPU: --dry-run end to end, the one-line exit, the shapes."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from placer.costs.model import CostModel
from placer.hardware.profiles import load_device_profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_kernel_check as gk  # noqa: E402



def test_dry_run_prices_every_shape(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    assert gk.main(["--dry-run", "--csv", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "model: CostModel.op_time(..., 'gpu') with profile h200-141gb-pcie5; --dry-run: nothing timed"
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(gk.SHAPES) == 8 * 3 + 5 * 2
    assert [r["op"] for r in rows[:3]] == ["Conv", "ConvTranspose", "ConvGradient"]
    assert all(r["measured_us"] == "" and r["ratio"] == "" and float(r["model_us"]) > 0 for r in rows)
    assert len([line for line in text if line.startswith(("conv_", "gemm "))]) == len(rows)
    assert not any(line.startswith("group") for line in text)   # nothing measured: no error figures


def test_the_model_column_is_cost_model_op_time_and_a_gemm_is_above_its_compute_floor():
    h200 = load_device_profile("h200-141gb-pcie5", "gpu")
    model = CostModel(devices=[load_device_profile(gk.DEFAULT_CPU_PROFILE, "cpu"), h200])
    shape = gk.Shape("gemm", "4096", (4096, 4096, 4096), "float16")
    [row] = gk.price([shape], "h200-141gb-pcie5")
    op, inputs, feats = gk.typed_one_op(gk.build_net(shape))
    assert [t.shape for t in inputs] == [(4096, 4096), (4096, 4096)]
    assert feats.flops == pytest.approx(2 * 4096 ** 3)
    assert row.model_s == model.op_time("MatMul", inputs, op.args, feats, "gpu")[0]
    assert row.model_s >= 2 * 4096 ** 3 / h200.peak("float16")     # never faster than the datasheet peak


def test_conv_rows_are_the_resnet_shapes_in_three_directions():
    fwd, bwd_data, bwd_filter = (gk.Shape(d, "res3", (32, 128, 128, 56, 3, 2, 1)) for d in gk.DIRECTIONS)
    _, x_w, _ = gk.typed_one_op(gk.build_net(fwd))
    assert [t.shape for t in x_w] == [(32, 128, 56, 56), (128, 128, 3, 3)]
    op, dy_w, _ = gk.typed_one_op(gk.build_net(bwd_data))
    assert [t.shape for t in dy_w] == [(32, 128, 28, 28), (128, 128, 3, 3)] and op.args["adj"] == 1
    op, ins, feats = gk.typed_one_op(gk.build_net(bwd_filter))
    assert op.type == "ConvGradient" and op.args["no_gradient_to_input"] == 1
    assert feats.macs == 32 * 128 * 28 * 28 * 128 * 9                  # dW only: the forward's MACs


def test_without_a_gpu_it_exits_2_with_one_line(capsys, monkeypatch):
    # the probe answers "no GPU" here even on a machine that has one, so the test always runs
    monkeypatch.setattr(gk, "gpu_or_reason", lambda: (None, "no CUDA device visible"))
    assert gk.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_kernel_check: ") and "--dry-run" in err[0]


def test_bad_usage_exits_2(capsys):
    assert gk.main(["--dry-run", "--gpu-profile", "no-such-gpu"]) == 2
    assert gk.main(["--dry-run", "--repeat", "0"]) == 2


def test_summary_figures():
    rows = [gk.Row(gk.Shape("gemm", "n", (1, 1, 1)), "MatMul", model_s=m, source="roofline", measured_s=1.0)
            for m in (0.5, 1.0, 2.0)]
    [(group, n, med, p90, ratio), (overall, *_)] = gk.summary(rows)
    assert (group, n, overall) == ("gemm float32", 3, "all")
    assert med == pytest.approx(0.5) and ratio == pytest.approx(1.0)
    assert p90 == pytest.approx(0.5 + 0.8 * 0.5)    # |err| 0, 0.5, 1.0: the 0.9 quantile interpolates


@pytest.mark.gpu
def test_timing_one_gemm_and_one_conv_on_a_gpu():
    import cupy
    rows = gk.price([gk.Shape("gemm", "1024", (1024, 1024, 1024)), gk.SHAPES[3]], "h200-141gb-pcie5")
    for row in rows:
        gk.time_row(cupy, row, warmup=1, repeat=3)
        assert 0 < row.measured_s < 1.0 and row.ratio > 0
    assert rows[0].engine == "cupy matmul" and rows[1].engine.startswith(("cudnn", "matmul"))
