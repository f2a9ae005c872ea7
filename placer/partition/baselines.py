"""Baselines reported beside every plan, scored with the same serial cost function.

All honour hard pins (an op without a GPU kernel stays on the CPU; a user's GPU pin stays
on the GPU) and colocation (a group follows its pin, else the choice of its members):
- ``all_cpu``: every free op on the CPU;
- ``all_gpu``: every free op on the GPU, CPU fallback for ops without a GPU kernel
  (what Caffe2 does by itself);
- ``greedy``: each op on its individually faster device, copies paid afterwards
  (a colocated group on the device where its members' summed time is lower);
- ``existing``: a given op -> device map (a file's own device_options);
- ``lower_bound``: sum over ops of min(cpu, gpu) (pinned ops on their pin), no copies:
  a ``PlanCost``, not a placement; no plan can cost less.
"""
from __future__ import annotations

import numpy as np

from placer.partition.explain import make_plan
from placer.partition.problem import PIN_CPU, PIN_GPU, CostArrays, from_graph, placement_array
from placer.types import PlanCost


def _with_pins(arr: CostArrays, free_gpu: np.ndarray) -> np.ndarray:
    x = np.asarray(free_gpu, bool).copy()
    x[arr.forced == PIN_CPU] = False
    x[arr.forced == PIN_GPU] = True
    return x


def all_cpu(graph):
    arr = from_graph(graph)
    return make_plan(arr, _with_pins(arr, np.zeros(arr.n_ops, bool)), "all_cpu")


def all_gpu(graph):
    arr = from_graph(graph)
    return make_plan(arr, _with_pins(arr, np.ones(arr.n_ops, bool)), "all_gpu")


def greedy(graph):
    arr = from_graph(graph)
    comp = arr.component
    saving = np.bincount(comp, weights=arr.cpu_s - arr.gpu_s, minlength=comp.max() + 1)
    return make_plan(arr, _with_pins(arr, saving[comp] > 0), "greedy")


def existing(graph, placement: dict):
    """Score a given placement as it is (no pins applied: it is what the file says)."""
    arr = from_graph(graph)
    return make_plan(arr, placement_array(placement, arr.n_ops), "existing")


def lower_bound(graph) -> PlanCost:
    arr = from_graph(graph)
    best = np.minimum(arr.cpu_s, arr.gpu_s)
    best = np.where(arr.forced == PIN_CPU, arr.cpu_s, best)
    best = np.where(arr.forced == PIN_GPU, arr.gpu_s, best)
    return PlanCost(float(best.sum()), 0.0)


def baselines(graph, existing_placement: dict | None = None) -> dict:
    """Every baseline: name -> Plan (``lower_bound`` -> PlanCost)."""
    arr = from_graph(graph)
    out = {"all_cpu": all_cpu(arr), "all_gpu": all_gpu(arr), "greedy": greedy(arr)}
    if existing_placement:
        out["existing"] = existing(arr, existing_placement)
    out["lower_bound"] = lower_bound(arr)
    return out


__all__ = ["all_cpu", "all_gpu", "greedy", "existing", "lower_bound", "baselines"]
