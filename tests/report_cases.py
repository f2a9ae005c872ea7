"""Plan and run-record dicts for the report and trace tests, in the layouts that
``placer plan --json`` and ``placer run --record`` write (built here, independent of
the planner, so these tests pin the contract rather than the planner's output)."""
from __future__ import annotations

import numpy as np

TYPES = ["Conv", "SpatialBN", "Relu", "Conv", "SpatialBN", "Add", "Relu", "MaxPool", "FC",
         "SparseLengthsSum", "Concat", "Softmax"]


def hand_plan() -> dict:
    """Four ops: data -> conv (gpu) -> relu (gpu) -> fc (cpu) -> softmax (cpu)."""
    ops = [
        _op(0, "conv1", "Conv", "gpu", 4e-3, 2e-4, "GPU 20x faster"),
        _op(1, "relu1", "Relu", "gpu", 3e-4, 2e-5, "GPU 15x faster"),
        _op(2, "fc", "FC", "cpu", 1e-4, 8e-5, "CPU: copy of 'relu1' costs more than GPU saves"),
        _op(3, "prob", "Softmax", "cpu", 1e-5, 3e-5, "CPU 3x faster"),
    ]
    tensors = [
        _t("data", -1, [0], 602112, 5e-5, 5e-5),
        _t("conv1_w", -2, [0], 37632, 3e-6, 3e-6),
        _t("conv1", 0, [1], 3211264, 2.7e-4, 2.7e-4),
        _t("relu1", 1, [2], 3211264, 2.7e-4, 2.7e-4),
        _t("fc", 2, [3], 4000, 1e-6, 1e-6),
        _t("prob", 3, [], 4000, 1e-6, 1e-6, external_output=True),
    ]
    copies = [{"tensor": "data", "direction": "h2d", "bytes": 602112, "time_s": 5e-5},
              {"tensor": "relu1", "direction": "d2h", "bytes": 3211264, "time_s": 2.7e-4}]
    serial = _serial_events(ops, copies)
    makespan = _serial_events(ops, copies)
    return {
        "net": "tiny", "path": "tiny.pbtxt", "objective": "serial", "method": "mincut",
        "total_s": sum(o[f"{o['device']}_s"] for o in ops) + sum(c["time_s"] for c in copies),
        "optimal": True, "gap": 0.0, "optimality": "optimal for the serial objective",
        "profiles": {"cpu": {"name": "ci-host", "source": "measured", "path": "profiles/cpu.json"},
                     "gpu": {"name": "V100-16GB", "source": "datasheet", "path": "profiles/v100.json"}},
        "ops": ops, "tensors": tensors, "copies": copies,
        "baselines": {"all_cpu": {"total_s": 4.41e-3}, "all_gpu": {"total_s": 6.7e-4},
                      "greedy": {"total_s": 6.7e-4}, "existing": {"total_s": 5e-3},
                      "lower_bound": {"total_s": 2.6e-4}},
        "gpu_memory": {"used_bytes": 7.1e6, "capacity_bytes": 14.4e9, "param_bytes": 37632,
                       "peak_activation_bytes": 7e6},
        "memory_timeline": {"cpu": [602112, 602112, 3215264, 8000], "gpu": [3.8e6, 7.1e6, 0, 0]},
        "pcie_bytes": {"h2d": 602112, "d2h": 3211264},
        "schedules": {"serial": {"makespan_s": serial[-1]["end_s"], "events": serial},
                      "makespan": {"makespan_s": makespan[-1]["end_s"], "events": makespan}},
    }


def synthetic_plan(n_ops: int = 300, seed: int = 0) -> dict:
    """A ResNet-like chain with skip connections and a few wide layers, random devices."""
    rng = np.random.default_rng(seed)
    ops, tensors = [], []
    for i in range(n_ops):
        cpu = float(rng.lognormal(-8, 1.5))
        gpu = float(cpu / rng.uniform(0.3, 30))
        dev = "gpu" if (gpu < cpu and rng.random() < 0.85) else "cpu"
        ops.append(_op(i, f"op_{i}_{TYPES[i % len(TYPES)].lower()}_block{i // 12}", TYPES[i % len(TYPES)],
                       dev, cpu, gpu, "GPU faster" if dev == "gpu" else "CPU faster"))
    tensors.append(_t("data", -1, [0], 1e6, 1e-4, 1e-4))
    for i in range(n_ops - 1):
        consumers = [i + 1] + ([i + 3] if i % 6 == 0 and i + 3 < n_ops else []) + \
                    ([i + 2] if i % 25 == 0 and i + 2 < n_ops else [])
        size = float(rng.integers(1, 64) * 65536)
        tensors.append(_t(f"t{i}", i, consumers, size, size / 12e9 + 1e-5, size / 13e9 + 1e-5))
    tensors.append(_t(f"t{n_ops - 1}", n_ops - 1, [], 4000, 1e-5, 1e-5, external_output=True))
    copies = []
    for t in tensors:
        p = t["producer"]
        pdev = "cpu" if p < 0 else ops[p]["device"]
        cdevs = {ops[c]["device"] for c in t["consumers"]}
        if t["external_output"]:
            cdevs.add("cpu")
        for d in cdevs - {pdev}:
            direction = "h2d" if d == "gpu" else "d2h"
            copies.append({"tensor": t["name"], "direction": direction, "bytes": t["bytes"],
                           "time_s": t[f"{direction}_s"]})
    serial = _serial_events(ops, copies)
    makespan = _lane_events(ops, copies)
    total = sum(o[f"{o['device']}_s"] for o in ops) + sum(c["time_s"] for c in copies)
    live = np.cumsum(rng.integers(-3, 5, size=n_ops)).clip(0) * 2.0**20
    return {
        "net": "synthetic300", "path": "synthetic.pbtxt", "objective": "makespan", "method": "makespan",
        "total_s": total, "optimal": False, "gap": None,
        "optimality": "no proof: local search from the min-cut plan",
        "profiles": {"cpu": {"name": "ci-host", "source": "measured", "path": "cpu.json"},
                     "gpu": {"name": "A100-40GB", "source": "datasheet", "path": "a100.json"}},
        "ops": ops, "tensors": tensors, "copies": copies,
        "baselines": {"all_cpu": {"total_s": sum(o["cpu_s"] for o in ops)},
                      "all_gpu": {"total_s": float("inf"), "note": "does not fit"},
                      "greedy": {"total_s": total * 1.1},
                      "lower_bound": {"total_s": sum(min(o["cpu_s"], o["gpu_s"]) for o in ops)}},
        "gpu_memory": {"used_bytes": 3.0e9, "capacity_bytes": 36e9, "param_bytes": 1e9,
                       "peak_activation_bytes": 2e9},
        "memory_timeline": {"cpu": (live * 0.5).tolist(), "gpu": live.tolist()},
        "pcie_bytes": {d: sum(c["bytes"] for c in copies if c["direction"] == d) for d in ("h2d", "d2h")},
        "schedules": {"serial": {"makespan_s": serial[-1]["end_s"], "events": serial},
                      "makespan": {"makespan_s": max(e["end_s"] for e in makespan), "events": makespan}},
    }


def run_record(plan: dict, emulated: bool = True, seed: int = 1) -> dict:
    """A RunRecord dict (``placer.runtime.record.to_dict`` layout) of the placed net:
    the plan's ops in order with copy ops inserted before their first GPU/CPU reader."""
    rng = np.random.default_rng(seed)
    gpu_name = "emulated-cuda:0" if emulated else "cuda:0"
    copy_before = {}
    for c in plan["copies"]:
        t = next(t for t in plan["tensors"] if t["name"] == c["tensor"])
        readers = [r for r in t["consumers"] if plan["ops"][r]["device"] == ("gpu" if c["direction"] == "h2d" else "cpu")]
        copy_before.setdefault(min(readers) if readers else len(plan["ops"]), []).append(c)
    ops, k = [], 0
    for i, o in enumerate(plan["ops"] + [None]):
        for c in copy_before.get(i, []):
            to_gpu = c["direction"] == "h2d"
            ops.append(_run_op(k, "", "CopyCPUToGPU" if to_gpu else "CopyGPUToCPU",
                               gpu_name if to_gpu else "cpu", c["time_s"] * rng.uniform(0.5, 2),
                               int(c["bytes"]), c["direction"]))
            k += 1
        if o is not None:
            dev = gpu_name if o["device"] == "gpu" else "cpu"
            ops.append(_run_op(k, o["name"], o["type"], dev, o[f"{o['device']}_s"] * rng.lognormal(0, 0.4)))
            k += 1
    return {"schema": "placer.run_record", "schema_version": 1, "net_name": plan["net"],
            "devices": ["cpu", gpu_name], "ops": ops,
            "peak_bytes": {"cpu": 123456, gpu_name: 654321}, "emulated": emulated,
            "iterations": 3, "warmup": 1,
            "timing_labels": {"cpu": "cpu", gpu_name: gpu_name + (" (CPU timing)" if emulated else "")},
            "total_s": sum(o["time_s"] for o in ops)}


def _run_op(index, name, type_, device, time_s, copy_bytes=0, direction=""):
    return {"index": index, "name": name, "type": type_, "device": device, "time_s": time_s,
            "samples_s": [time_s] * 3, "copy_bytes": copy_bytes, "copy_direction": direction}


def _op(i, name, type_, device, cpu_s, gpu_s, reason):
    return {"index": i, "name": name, "type": type_, "device": device, "cpu_s": cpu_s, "gpu_s": gpu_s,
            "cpu_source": "measured", "gpu_source": "roofline", "reason": reason, "flops": 1e6,
            "param_bytes": 0.0, "output_bytes": 4096.0, "pinned": None}


def _t(name, producer, consumers, nbytes, h2d, d2h, external_output=False):
    return {"name": name, "producer": producer, "consumers": consumers, "bytes": nbytes,
            "h2d_s": h2d, "d2h_s": d2h, "external_output": external_output}


def _serial_events(ops, copies):
    """Everything one after another, as Caffe2's simple net runs it."""
    events, t = [], 0.0
    by_tensor = {}
    for c in copies:
        by_tensor.setdefault(c["tensor"], []).append(c)
    for c in by_tensor.pop("data", []):
        events.append(_copy_ev(c, t))
        t = events[-1]["end_s"]
    for o in ops:
        d = o[f"{o['device']}_s"]
        events.append({"lane": o["device"], "kind": "op", "name": o["name"], "op": o["index"],
                       "tensor": None, "type": o["type"], "bytes": None, "start_s": t, "end_s": t + d})
        t += d
        for c in by_tensor.get(f"t{o['index']}", []) + by_tensor.get(o["name"], []):
            events.append(_copy_ev(c, t))
            t = events[-1]["end_s"]
    return events


def _lane_events(ops, copies):
    """Lanes that overlap: each lane runs its items in order after the previous item."""
    lane = {"cpu": 0.0, "gpu": 0.0, "h2d": 0.0, "d2h": 0.0}
    events, ready = [], 0.0
    by_tensor = {}
    for c in copies:
        by_tensor.setdefault(c["tensor"], []).append(c)
    for o in ops:
        d = o["device"]
        start = max(lane[d], ready * 0.5)
        end = start + o[f"{d}_s"]
        lane[d] = end
        events.append({"lane": d, "kind": "op", "name": o["name"], "op": o["index"], "tensor": None,
                       "type": o["type"], "bytes": None, "start_s": start, "end_s": end})
        ready = end
        for c in by_tensor.get(f"t{o['index']}", []):
            ev = _copy_ev(c, max(lane[c["direction"]], end))
            lane[c["direction"]] = ev["end_s"]
            events.append(ev)
    return events


def _copy_ev(c, start):
    return {"lane": c["direction"], "kind": "copy", "name": f"copy {c['tensor']}", "op": None,
            "tensor": c["tensor"], "type": None, "bytes": c["bytes"], "start_s": start,
            "end_s": start + c["time_s"]}
