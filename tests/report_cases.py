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


# --- version 2: a CPU and four GPUs ---------------------------------------------------

GIB, MIB, US = 2.0 ** 30, 2.0 ** 20, 1e-6
GPUS4 = ("cuda:0", "cuda:1", "cuda:2", "cuda:3")


def four_gpu_plan(hetero: bool = False) -> dict:
    """A version-2 plan (docs/PLAN_JSON.md) on a CPU and four 16 GiB GPUs: four 4 GiB
    embedding tables, one per GPU (they cannot share one: 14.4 GiB usable), their
    lookups joined on cuda:1, the output back on the host. Times by hand, in µs: a
    lookup 700 on the CPU and 13 on a GPU, Concat 50 / 8, FC 3000 / 60, Sigmoid 8 / 5;
    copies: ``ids`` (4 KiB) to each GPU 10, an embedding (1 MiB) to cuda:1 60 over
    NVLink from cuda:0 and cuda:3, 120 staged through the host from cuda:2, ``prob``
    (1 KiB) back 10. ``hetero``: cuda:3 is a slower GPU (every GPU time x3 there)."""
    devices = ("cpu",) + GPUS4
    placed = ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:1", "cuda:1", "cuda:1"]
    specs = [(f"emb{k}", "SparseLengthsSum", 700.0, 13.0) for k in range(4)] + \
        [("cat", "Concat", 50.0, 8.0), ("fc", "FC", 3000.0, 60.0), ("prob", "Sigmoid", 8.0, 5.0)]
    ops = []
    for i, ((name, type_, cpu, gpu), dev) in enumerate(zip(specs, placed)):
        times = {"cpu": cpu * US, **{d: gpu * US * (3 if hetero and d == "cuda:3" else 1) for d in GPUS4}}
        ops.append({"index": i, "name": name, "type": type_, "device": dev, "device_kind": "gpu",
                    "time_s": times, "source": {"cpu": "measured", **{d: "roofline" for d in GPUS4}},
                    "cpu_s": times["cpu"], "cpu_source": "measured", "gpu_s": times["cuda:0"], "gpu_source": "roofline",
                    "reason": f"{dev}: its 4 GiB of parameters do not fit beside the others" if i < 4
                    else f"{dev} 50x faster than cpu", "flops": 1e6, "param_bytes": 4 * GIB if i < 4 else 0.0,
                    "output_bytes": MIB, "outputs": [name], "pinned": None, "copies_in": [], "copies_out": []})
    tensors = [{"name": "ids", "producer": -1, "consumers": [0, 1, 2, 3], "bytes": 4096.0, "external_output": False}]
    tensors += [{"name": f"table{k}", "producer": -2, "consumers": [k], "bytes": 4 * GIB, "external_output": False}
                for k in range(4)]
    tensors += [{"name": f"emb{k}", "producer": k, "consumers": [4], "bytes": MIB, "external_output": False}
                for k in range(4)]
    tensors += [{"name": "cat", "producer": 4, "consumers": [5], "bytes": 4 * MIB, "external_output": False},
                {"name": "fc", "producer": 5, "consumers": [6], "bytes": 1024.0, "external_output": False},
                {"name": "prob", "producer": 6, "consumers": [], "bytes": 1024.0, "external_output": True}]
    copies = [_copy("ids", "cpu", d, 4096.0, 10, -1, [k]) for k, d in enumerate(GPUS4)]
    copies += [_copy("emb0", "cuda:0", "cuda:1", MIB, 60, 0, [4]), _copy("emb2", "cuda:2", "cuda:1", MIB, 120, 2, [4]),
               _copy("emb3", "cuda:3", "cuda:1", MIB, 60, 3, [4]), _copy("prob", "cuda:1", "cpu", 1024.0, 10, 6, [-1])]
    links = {}
    for c in copies:
        row = links.setdefault((c["src"], c["dst"]), {"src": c["src"], "dst": c["dst"], "bytes": 0.0, "copies": 0,
                                                      "time_s": 0.0})
        row["bytes"] += c["bytes"]
        row["copies"] += 1
        row["time_s"] += c["time_s"]
    compute = sum(o["time_s"][o["device"]] for o in ops)
    copy_s = sum(c["time_s"] for c in copies)
    used = {"cpu": 0.0, "cuda:0": 4 * GIB + MIB, "cuda:1": 4 * GIB + 8 * MIB, "cuda:2": 4 * GIB + MIB,
            "cuda:3": 4 * GIB + MIB}
    memory = {d: {"used_bytes": used[d], "param_bytes": 0.0 if d == "cpu" else 4 * GIB,
                  "peak_activation_bytes": used[d] - (0.0 if d == "cpu" else 4 * GIB),
                  "capacity_bytes": None if d == "cpu" else 16 * GIB, "usable_bytes": None if d == "cpu" else 14.4 * GIB}
              for d in devices}
    timeline = {"cpu": [0.0] * 7, "cuda:0": [4 * GIB + MIB] + [4 * GIB] * 6,
                "cuda:1": [4 * GIB + MIB, 4 * GIB + 4 * MIB, 4 * GIB + 4 * MIB, 4 * GIB + 4 * MIB,
                           4 * GIB + 8 * MIB, 4 * GIB + 5 * MIB, 4 * GIB + 1024],
                "cuda:2": [4 * GIB] * 2 + [4 * GIB + MIB] + [4 * GIB] * 4,
                "cuda:3": [4 * GIB] * 3 + [4 * GIB + MIB] + [4 * GIB] * 3}
    baselines = {
        "all_cpu": _base(4 * 700 + 50 + 3000 + 8, ["cpu"], "all on the CPU"),
        "all_gpu": _base(4 * 13 + 8 + 60 + 5 + 40 + 10, ["cuda:0"], "all on one GPU (CPU fallback)",
                         "needs 16 GiB on cuda:0; 14.4 GiB usable"),
        "greedy": _base(4 * 13 + 8 + 60 + 5 + 40 + 10, ["cuda:0"], "greedy (each op on its fastest device)",
                        "needs 16 GiB on cuda:0; 14.4 GiB usable"),
        "pipeline": _base(610, ["cuda:0", "cuda:1"], "pipeline split over the GPUs (balanced by compute)",
                          "needs 16 GiB on cuda:0; 14.4 GiB usable"),
        "m_topo": _base(520, list(GPUS4), "Baechi m-TOPO"),
        "m_etf": _base(450, list(GPUS4), "Baechi m-ETF"),
        "lower_bound": {"total_s": (4 * 13 + 8 + 60 + 5) * US, "label": "lower bound (sum of per-op minima, no copies)",
                        "feasible": True}}
    serial = _serial_v2(ops, copies)
    makespan = _makespan_v2()
    return {
        "schema_version": 2, "net": "four_tables", "path": "four_tables.pbtxt", "objective": "serial",
        "method": "auto", "solver": "expansion-memory", "total_s": compute + copy_s, "compute_s": compute,
        "copy_s": copy_s, "optimal": True, "gap": 0.0,
        "optimality": "optimal for the serial objective within the memory limits", "outputs_on_host": True,
        "notes": ["MILP: optimal"],
        "machine": {"name": "4x-v100", "description": "ci-host; 4 x V100 16 GB; GPU links: nvlink2, staged",
                    "devices": [{"name": d, "kind": "cpu" if d == "cpu" else "gpu",
                                 "profile": "ci-host" if d == "cpu" else ("T4" if hetero and d == "cuda:3" else "V100")}
                                for d in devices]},
        "devices": list(devices),
        "profiles": {"cpu": {"name": "ci-host", "source": "measured"}, "gpu": {"name": "V100", "source": "datasheet"},
                     **{d: {"name": "T4" if hetero and d == "cuda:3" else "V100", "source": "datasheet"} for d in GPUS4}},
        "ops": ops, "tensors": tensors, "copies": copies, "baselines": baselines, "memory": memory,
        "gpu_memory": dict(memory["cuda:1"], device="cuda:1"), "memory_timeline": timeline,
        "link_bytes": [links[k] for k in sorted(links)],
        "pcie_bytes": {"h2d": 4 * 4096.0, "d2h": 1024.0, "d2d": 3 * MIB},
        "schedules": {"serial": {"makespan_s": serial[-1]["end_s"], "events": serial},
                      "makespan": {"makespan_s": 226 * US, "events": makespan}},
    }


def _copy(tensor, src, dst, nbytes, time_us, producer, consumers):
    kinds = ("cpu" if src == "cpu" else "gpu", "cpu" if dst == "cpu" else "gpu")
    return {"tensor": tensor, "src": src, "dst": dst, "bytes": nbytes, "time_s": time_us * US,
            "direction": {("cpu", "gpu"): "h2d", ("gpu", "cpu"): "d2h"}.get(kinds, "d2d"),
            "producer": producer, "consumers": consumers}


def _base(total_us, devices, label, why=None):
    out = {"total_s": total_us * US, "compute_s": total_us * US, "copy_s": 0.0, "feasible": why is None,
           "label": label, "gpu_ops": 7, "devices_used": devices, "gpu_memory_bytes": 0.0}
    if why:
        out["why_infeasible"] = why
    return out


def _serial_v2(ops, copies):
    """Every op and copy one after another: the host-fed ``ids`` first, each op's output
    copies right after it. Lanes: device names, ``src->dst`` for copies."""
    events, t = [], 0.0
    after = {}
    for c in copies:
        after.setdefault(c["producer"], []).append(c)
    for c in after.get(-1, []):
        events.append(_copy_ev_v2(c, f"{c['src']}->{c['dst']}", t, t + c["time_s"]))
        t = events[-1]["end_s"]
    for o in ops:
        d = o["time_s"][o["device"]]
        events.append({"lane": o["device"], "kind": "op", "name": o["name"], "op": o["index"], "tensor": None,
                       "type": o["type"], "bytes": None, "start_s": t, "end_s": t + d})
        t += d
        for c in after.get(o["index"], []):
            events.append(_copy_ev_v2(c, f"{c['src']}->{c['dst']}", t, t + c["time_s"]))
            t = events[-1]["end_s"]
    return events


MAKESPAN_EVENTS = [   # (lane, op or tensor, start µs, end µs): by hand, module docstring of four_gpu_plan
    ("pcie[switch0]:h2d", "ids:cuda:0", 0, 10), ("pcie[switch0]:h2d", "ids:cuda:1", 10, 20),
    ("pcie[switch1]:h2d", "ids:cuda:2", 0, 10), ("pcie[switch1]:h2d", "ids:cuda:3", 10, 20),
    ("cuda:0", 0, 10, 23), ("cuda:2", 2, 10, 23), ("cuda:1", 1, 20, 33), ("cuda:3", 3, 20, 33),
    ("cuda:0->cuda:1", "emb0:cuda:1", 23, 83), ("pcie[switch1]:d2h", "emb2:cuda:1", 23, 83),
    ("pcie[switch0]:h2d", "emb2:cuda:1", 83, 143), ("cuda:3->cuda:1", "emb3:cuda:1", 33, 93),
    ("cuda:1", 4, 143, 151), ("cuda:1", 5, 151, 211), ("cuda:1", 6, 211, 216),
    ("pcie[switch0]:d2h", "prob:cpu", 216, 226)]


def _makespan_v2():
    names = ["emb0", "emb1", "emb2", "emb3", "cat", "fc", "prob"]
    types = ["SparseLengthsSum"] * 4 + ["Concat", "FC", "Sigmoid"]
    devices = ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:1", "cuda:1", "cuda:1"]
    producer = {"ids": -1, "emb0": 0, "emb2": 2, "emb3": 3, "prob": 6}
    events = []
    for lane, what, a, b in MAKESPAN_EVENTS:
        if isinstance(what, int):
            events.append({"lane": lane, "kind": "op", "op": what, "tensor": None, "src": None, "dst": None,
                           "name": names[what], "type": types[what], "bytes": None,
                           "start_s": a * US, "end_s": b * US})
        else:
            tensor, dst = what.split(":", 1)
            p = producer[tensor]   # a copy's "op" is its producer, as the simulator writes it
            events.append({"lane": lane, "kind": "copy", "op": p if p >= 0 else None, "tensor": tensor,
                           "src": "cpu" if p < 0 else devices[p], "dst": dst, "name": tensor, "type": None,
                           "bytes": None, "start_s": a * US, "end_s": b * US})
    return events


def _copy_ev_v2(c, lane, start, end):
    return {"lane": lane, "kind": "copy", "name": c["tensor"], "op": None, "tensor": c["tensor"], "type": None,
            "bytes": c["bytes"], "src": c["src"], "dst": c["dst"], "start_s": start, "end_s": end}


def four_gpu_run(plan: dict) -> dict:
    """A run record (version 1 of the record, with per-copy ``links``) of the placed net
    on four emulated GPUs: each copy op just before its first reader, as the placed net
    has it (``Copy`` under the destination GPU for GPU to GPU). Op times are the plan's
    CPU times x 1.5 (an emulated GPU runs on the CPU), copies their predicted time x 2."""
    emulated = {d: f"emulated-{d}" if d != "cpu" else "cpu" for d in ("cpu",) + GPUS4}
    before = {}
    for c in plan["copies"]:
        first = min([r for r in c["consumers"] if r >= 0], default=len(plan["ops"]))
        before.setdefault(first, []).append(c)
    ops = []
    for i, o in enumerate(plan["ops"] + [None]):
        for c in before.get(i, []):
            kind = c["direction"]
            type_ = {"h2d": "CopyCPUToGPU", "d2h": "CopyGPUToCPU", "d2d": "Copy"}[kind]
            where = emulated[c["dst"] if kind != "d2h" else c["src"]]
            op = _run_op(len(ops), "", type_, where, c["time_s"] * 2, int(c["bytes"]), kind)
            op["links"] = [[emulated[c["src"]], emulated[c["dst"]], int(c["bytes"])]]
            ops.append(op)
        if o is not None:
            ops.append(dict(_run_op(len(ops), o["name"], o["type"], emulated[o["device"]], o["cpu_s"] * 1.5),
                            links=[]))
    return {"schema": "placer.run_record", "schema_version": 1, "net_name": plan["net"],
            "devices": list(emulated.values()), "ops": ops,
            "peak_bytes": {"cpu": 5120, **{emulated[d]: int(4 * GIB + (5 if d == "cuda:1" else 1) * MIB) for d in GPUS4}},
            "emulated": True, "iterations": 2, "warmup": 1,
            "timing_labels": {v: v + (" (CPU timing)" if v != "cpu" else "") for v in emulated.values()},
            "total_s": sum(o["time_s"] for o in ops)}
