"""The data-parallel and sharding plans of reports/BENCHMARKS.md ("Data parallelism and sharding").

1. ``dlrm``: MLPerf DLRM Criteo Terabyte (placer.examples.dlrm.criteo_1tb: 26 tables x 128,
   89.5 GiB; RowWiseSparseAdagrad on the tables, Adagrad on the MLPs) at global batches
   16k, 32k and 64k on 8x A100 40 GB (NVSwitch), 8x V100 16 GB (NVLink 2) and 2 hosts x 8
   A100 (bench/sharding_machines.py): the plan (GPUs used, step, samples/s, MILP gap,
   planning time) against pure data parallelism, every table in host memory and
   TorchRec's greedy planner (re-implemented), all under placer's cost model.
2. ``resnet``: ResNet-50 (bottleneck blocks 3-4-6-3, train-mode SpatialBN, momentum SGD)
   at 32 images per GPU on 1, 2, 4 and 8 V100s and A100s, NVLink and PCIe (no peer-to-peer:
   copies staged through host memory): step, images/s, scaling efficiency (images/s over k
   times one GPU's), and the degree the planner picks (the most images/s).

GPU times come from the shipped profiles' kernel model (cuBLAS GEMM tiles, cuDNN convolution
algorithms, fitted to DeepBench kernel times: placer/costs/gpu_kernels.py), not a measurement
(no GPU here); re-run with measured profiles on a GPU host.

    python bench/sharding_plans.py dlrm
    python bench/sharding_plans.py resnet
    python bench/sharding_plans.py resnet-strong --batches 32,256
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from sharding_machines import machine  # noqa: E402

from placer.examples import dlrm  # noqa: E402
from placer.examples.builder import NetBuilder  # noqa: E402
from placer.formats.caffe2 import net_from_netdef  # noqa: E402
from placer.hardware.machine import compose_machine, load_machine  # noqa: E402
from placer.sharding.plan import plan_sharding  # noqa: E402
from placer.sharding.net import DlrmTrainNet, typed_train_net  # noqa: E402
from placer.hardware.profiles import load_device_profile  # noqa: E402
from placer.types import TensorType  # noqa: E402
from placer.units import fmt_time  # noqa: E402


def dlrm_table(batches: list[int], machines: list[str], time_limit: float) -> None:
    source = DlrmTrainNet(dlrm.criteo_1tb())
    print("| machine | global batch | plan: GPUs, step, samples/s | MILP gap | planned in | pure DP | "
          "all tables on host | TorchRec-style greedy |")
    print("|---|---|---|---|---|---|---|---|")
    for name in machines:
        m, how = machine(name)
        for G in batches:
            r = plan_sharding(source, m, global_batch=G, time_limit_s=time_limit, budget_s=25.0)
            p = r.plan
            gap = "optimal" if p.optimal else (f"{p.gap:.1%}" if p.gap is not None else "-")
            cells = []
            for key in ("data_parallel", "host", "torchrec"):
                b = r.baselines[key]
                cells.append(f"{fmt_time(b.total_s)} ({b.total_s / b.global_batch / (p.total_s / p.global_batch):.2f}x)"
                             if math.isfinite(b.total_s) else "does not fit: " + b.notes[0].split(" (")[0])
            fits = max(s.memory_bytes / s.capacity_bytes for s in p.stats if math.isfinite(s.capacity_bytes))
            print(f"| {name} | {G} | {len(p.ranks)} GPUs, {fmt_time(p.total_s)}, {G / p.total_s:,.0f}/s "
                  f"(fullest GPU {fits:.0%}) | {gap} | {r.seconds:.1f} s | " + " | ".join(cells) + " |")
            for line in r.differences[:2]:
                print(f"|   | | differs from TorchRec: {line} | | | | | |")
        print(f"<!-- {name}: {how} -->")


# ------------------------------------------------------------------ ResNet-50

def _conv_bn(b: NetBuilder, name: str, x: str, cin: int, cout: int, k: int, stride: int, pad: int, relu: bool) -> str:
    w = b.param(f"{name}_w", (cout, cin, k, k), "MSRAFill")
    y = b.op("Conv", [x, w], name, kernel=k, stride=stride, pad=pad)
    scale = b.param(f"{name}_bn_s", (cout,), "ConstantFill", value=1.0)
    shift = b.param(f"{name}_bn_b", (cout,), "ConstantFill", value=0.0)
    mean = b.param(f"{name}_bn_rm", (cout,), "ConstantFill", value=0.0)
    var = b.param(f"{name}_bn_riv", (cout,), "ConstantFill", value=1.0)
    y = b.op("SpatialBN", [y, scale, shift, mean, var], [f"{name}_bn", mean, var, f"{name}_bn_sm", f"{name}_bn_siv"],
             is_test=0, epsilon=1e-5, momentum=0.9)
    return b.op("Relu", [y], f"{y}_relu") if relu else y


def resnet50(batch: int, classes: int = 1000) -> NetBuilder:
    """ResNet-50 v1 (He et al. 2016, Table 1): 7x7 stem, bottleneck stages of 3, 4, 6, 3."""
    b = NetBuilder("resnet50")
    x = b.input("data", (batch, 3, 224, 224))
    b.input("label", (batch,), "int32")
    x = _conv_bn(b, "conv1", x, 3, 64, 7, 2, 3, True)
    x = b.op("MaxPool", [x], "pool1", kernel=3, stride=2, pad=1)
    cin = 64
    for s, (mid, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for i in range(blocks):
            stride = 2 if (s > 0 and i == 0) else 1
            name = f"res{s + 2}_{i}"
            y = _conv_bn(b, f"{name}_a", x, cin, mid, 1, stride, 0, True)
            y = _conv_bn(b, f"{name}_b", y, mid, mid, 3, 1, 1, True)
            y = _conv_bn(b, f"{name}_c", y, mid, mid * 4, 1, 1, 0, False)
            shortcut = x if i > 0 else _conv_bn(b, f"{name}_proj", x, cin, mid * 4, 1, stride, 0, False)
            x = b.op("Relu", [b.op("Sum", [y, shortcut], f"{name}_sum")], f"{name}_out")
            cin = mid * 4
    x = b.op("AveragePool", [x], "pool5", global_pooling=1)
    x = b.op("FC", [x, b.param("pred_w", (classes, cin), "XavierFill"),
                    b.param("pred_b", (classes,), "ConstantFill", value=0.0)], "pred")
    b.op("SoftmaxWithLoss", [x, "label"], ["softmax", "loss"])
    return b


class ResNet50Train:
    """ResNet-50's train net (momentum SGD, lr 0.1) at any batch."""

    name = "resnet50"

    def __init__(self):
        self._typed = {}

    def typed_at_batch(self, batch: int):
        if batch not in self._typed:
            from placer.training.recipe import OptimizerChoice, make_train_nets
            b = resnet50(batch)
            nets = make_train_nets(net_from_netdef(b.predict, b.init), ["loss"], OptimizerChoice("momentum", 0.1))
            shapes = {k: TensorType(tuple(s), dt) for k, (dt, s) in b.value_info.items()}
            self._typed[batch] = typed_train_net(net_from_netdef(nets.train, nets.init), shapes)
        return self._typed[batch]


def resnet_machines():
    host = load_device_profile("host-ci-2core", "cpu")
    v100 = load_device_profile("v100-16gb-sxm2", "gpu")
    return [("V100, NVLink 2 (every pair one link)", compose_machine(host, v100, 8, "nvlink2")),
            ("V100 PCIe 3, no P2P (staged)", compose_machine(host, load_device_profile("v100-16gb-pcie3", "gpu"), 8,
                                                             "staged")),
            ("A100, NVSwitch (8x-a100-40gb-nvswitch)", load_machine("8x-a100-40gb-nvswitch")),
            ("A100 PCIe 4, no P2P (staged)", compose_machine(host, load_device_profile("a100-40gb-pcie4", "gpu"), 8,
                                                             "staged"))]


def resnet_table(per_gpu: int) -> None:
    source = ResNet50Train()
    print("| machine | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs | plan picks |")
    print("|---|---|---|---|---|---|")
    for name, m in resnet_machines():
        t = time.perf_counter()
        r = plan_sharding(source, m, per_gpu_batch=per_gpu, degrees=[1, 2, 4, 8], time_limit_s=0)
        cells = []
        one = r.degrees[0]
        single = one.global_batch / one.total_s
        for p in r.degrees:
            rate = p.global_batch / p.total_s
            cells.append(f"{fmt_time(p.total_s)}, {rate:,.0f} img/s, {rate / (single * len(p.ranks)):.0%}")
        print(f"| {name} | " + " | ".join(cells) + f" | {len(r.plan.ranks)} GPUs ({time.perf_counter() - t:.1f} s) |")
        allreduce = r.plan.step.phases["allreduce_s"]
        print(f"<!-- {name}: chosen step {fmt_time(r.plan.total_s)}; its all-reduces {fmt_time(allreduce)}; "
              f"critical path: {', '.join(s.phase for s in r.plan.step.critical_path)} -->")


def resnet_strong_table(global_batch: int) -> None:
    """A fixed global batch over 1-8 GPUs: efficiency against the fewest GPUs that fit."""
    source = ResNet50Train()
    print(f"| machine (global batch {global_batch}) | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs | plan picks | "
          "critical path of the plan |")
    print("|---|---|---|---|---|---|---|")
    for name, m in resnet_machines():
        r = plan_sharding(source, m, global_batch=global_batch, degrees=[1, 2, 4, 8], time_limit_s=0)
        base = next(p for p in r.degrees if math.isfinite(p.total_s))
        cells = []
        for p in r.degrees:
            if not math.isfinite(p.total_s):
                cells.append("does not fit")
                continue
            eff = base.total_s * len(base.ranks) / (p.total_s * len(p.ranks))
            cells.append(f"{fmt_time(p.total_s)}, {eff:.0%}")
        path = ", ".join(f"{s.phase} {fmt_time(s.seconds)}" for s in r.plan.step.critical_path)
        print(f"| {name} | " + " | ".join(cells) + f" | {len(r.plan.ranks)} GPUs | {path} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("dlrm", "resnet", "resnet-strong"))
    ap.add_argument("--batches", default="16384,32768,65536")
    ap.add_argument("--machines", default="8x-a100,8x-v100,2x8-a100")
    ap.add_argument("--time-limit", type=float, default=8.0)
    ap.add_argument("--per-gpu", type=int, default=32)
    args = ap.parse_args()
    if args.what == "dlrm":
        dlrm_table([int(b) for b in args.batches.split(",")], args.machines.split(","), args.time_limit)
    elif args.what == "resnet":
        resnet_table(args.per_gpu)
    else:
        for batch in args.batches.split(","):
            resnet_strong_table(int(batch))


if __name__ == "__main__":
    main()
