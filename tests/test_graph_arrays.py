"""The arrays the partitioners are handed equal the networkx cost graph the user sees.

The planner builds ``CostArrays`` straight from the cost tables (``graph.cost_arrays``);
``--graph-out`` writes the networkx graph (``graph.build_cost_graph``). The oracle here is
``problem.from_graph`` of that graph: every field of the bulk arrays must equal it, dtypes
included, on nets priced by ``annotate`` on CPU + GPU machines of one to eight GPUs, with
pins, kernels missing on the GPU, in-place chains and parameter updates (colocation).
The colocation groups themselves are checked against their definitions, written out as
scans of every op for every parameter and blob.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from placer.planning import planner
from placer.costs.model import TensorTable, annotate
from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import net_from_netdef
from placer.costs.graph import build_cost_graph, cost_arrays
from placer.hardware.machine import load_machine
from placer.partition.problem import from_graph
from placer.planning.planner import PlanOptions
from placer.shapes import infer
from placer.types import TensorType

MACHINES = ("2x-t4-pcie3", "4x-v100-sxm2-nvlink", "8x-a100-40gb-nvswitch")


def random_layers(rng, n_ops: int) -> NetBuilder:
    """Ops reading random earlier blobs and parameters, some writing a parameter or their
    own input in place (pins narrow ``allowed`` as a missing GPU kernel would)."""
    b = NetBuilder("r")
    blobs = [b.input("x", (4, 4))]
    params = [b.param(f"p{k}", (4, 4), "XavierFill") for k in range(6)]
    for i in range(n_ops):
        ins = [blobs[j] for j in rng.integers(0, len(blobs), rng.integers(1, 3))]
        ins += [params[j] for j in rng.integers(0, len(params), rng.integers(0, 3))]
        roll = rng.random()
        out = (params[rng.integers(len(params))] if roll < 0.15 else ins[0] if roll < 0.35 else f"b{i}")
        b.op("Sum", ins, out, name=f"op{i}")
        blobs.append(out)
    b.output(blobs[-1])
    return b


def typed_layers(seed: int, n_ops: int):
    b = random_layers(np.random.default_rng(seed), n_ops)
    return infer(net_from_netdef(b.predict, b.init), {"x": TensorType((4, 4), "float32")})


def with_producers_reading(costs, every: int):
    """``costs`` with every ``every``-th made tensor also read by its producer (as a
    hand-made table may list an in-place op): that reader needs no copy and is dropped."""
    t = costs.tensors
    readers = [t.readers(x).tolist() + ([int(p)] if p >= 0 and x % every == 0 else [])
               for x, p in enumerate(t.producer.tolist())]
    ptr = np.zeros(len(readers) + 1, np.int64)
    ptr[1:] = np.cumsum([len(r) for r in readers])
    costs.tensors = TensorTable(t.names, t.producer, ptr, np.array([c for r in readers for c in r], np.int64),
                                t.nbytes, t.external_output)
    return costs


def same_arrays(a, b) -> None:
    """Every field of two CostArrays equal, dtypes included."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), f.name
        else:
            assert type(x) is type(y) and x == y, f.name


@pytest.mark.parametrize("machine_name", MACHINES)
@pytest.mark.parametrize("seed", range(3))
def test_cost_arrays_equal_the_arrays_of_the_networkx_graph(machine_name, seed):
    rng = np.random.default_rng(seed + 100)
    typed = typed_layers(seed, 80)
    net = typed.net
    machine = load_machine(machine_name)
    costs = with_producers_reading(annotate(typed, machine), every=3)
    gpus = [d.name for d in machine.devices if d.is_gpu]
    pins = (f"op{rng.integers(80)}=cpu", f"op{rng.integers(80)}={rng.choice(gpus)}", f"op{rng.integers(80)}=gpu")
    for outputs_on_host in (True, False):
        options = PlanOptions(pins=pins, outputs_on_host=outputs_on_host, gpu_mem_bytes=1e6)
        _, usable = planner.memory_limits(machine, options)
        args = planner.graph_arguments(net, costs, machine, options, usable)
        assert args["colocate"] and args["inplace"] and any(args["pin_reason"])
        same_arrays(cost_arrays(costs, **args), from_graph(build_cost_graph(costs, **args)))


def test_cost_arrays_check_what_the_graph_checks():
    costs = annotate(typed_layers(0, 5), load_machine("2x-t4-pcie3"))
    for build in (cost_arrays, build_cost_graph):
        with pytest.raises(ValueError, match=r"allowed has shape \(5, 2\), expected \(5, 3\)"):
            build(costs, np.ones((5, 2), bool))


@pytest.mark.parametrize("seed", range(5))
def test_colocation_groups_equal_their_definitions_by_brute_force(seed):
    """parameter_groups and inplace_pairs, built from one index (union-find), against the
    definitions written out (``placer.training.placement``, rules 1 and 3): the writers
    of each state blob share a device, merged wherever one op writes several state blobs
    (found here by repeated merging until nothing changes); an op that overwrites a blob
    an earlier op made shares that op's device, unless it writes state and the blob is not
    state (an update op's in-place gradient)."""
    b = random_layers(np.random.default_rng(seed), 60)
    net = net_from_netdef(b.predict, b.init)
    groups = [{op.index for op in net.ops if p in op.outputs} for p in net.params]
    groups = [g for g in groups if g]
    merged = True
    while merged:
        merged = False
        for a in range(len(groups)):
            for c in range(a + 1, len(groups)):
                if groups[a] & groups[c]:
                    groups[a] |= groups.pop(c)
                    merged = True
                    break
            if merged:
                break
    expected = [g for g in groups if len(g) > 1]
    # the generated nets update parameters in place: some ops write several of them
    assert sorted(map(sorted, planner.parameter_groups(net))) == sorted(map(sorted, expected))
    writes_state = {op.index for op in net.ops if set(op.outputs) & set(net.params)}
    pairs = set()
    for op in net.ops:
        for name in set(op.inputs) & set(op.outputs):
            earlier = [o.index for o in net.ops[:op.index] if name in o.outputs]
            if earlier and (op.index not in writes_state or name in net.params):
                pairs.add((op.index, earlier[-1]))
    assert set(planner.inplace_pairs(net)) == pairs and pairs
