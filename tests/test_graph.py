"""The cost graph: attributes, automatic pins, edges per tensor, round trip to arrays."""
import numpy as np
import pytest

from placer.errors import InfeasiblePlanError
from placer.graph import build_cost_graph, cost_arrays
from placer.partition.problem import from_graph, serial_cost
from placer.partition.synthetic import random_arrays, to_net_costs

from partition_cases import hand_net


def test_nodes_and_edges_follow_the_tables():
    arr = random_arrays(60, seed=3)
    costs = to_net_costs(arr)
    g = build_cost_graph(costs)
    assert g.number_of_nodes() == 60
    node = g.nodes[7]
    assert node["cpu_s"] == pytest.approx(arr.cpu_s[7]) and node["gpu_s"] == pytest.approx(arr.gpu_s[7])
    assert node["name"] == "op7" and node["type"] == "FC"
    for row in costs.tensors.itertuples():
        if row.producer >= 0:
            for c in row.consumers:
                assert row.name in g.edges[row.producer, c]["tensors"]
    n_pairs = len({(r.producer, c) for r in costs.tensors.itertuples() if r.producer >= 0
                   for c in r.consumers})
    assert g.number_of_edges() == n_pairs
    assert set(g.graph["external_inputs"]) == set(costs.tensors.name[costs.tensors.producer == -1])
    assert set(g.graph["params"]) == set(costs.tensors.name[costs.tensors.producer == -2])
    assert g.graph["outputs_on_host"] is True


def test_edge_sums_two_tensors_between_the_same_ops():
    costs = hand_net([(1, 1), (1, 1)], [("a", 0, [1], 0.1, 0.2), ("b", 0, [1], 0.3, 0.4)])
    e = build_cost_graph(costs).edges[0, 1]
    assert e["tensors"] == ("a", "b")
    assert e["h2d_s"] == pytest.approx(0.4) and e["d2h_s"] == pytest.approx(0.6)
    assert e["bytes"] == 2e6


def test_ops_without_gpu_kernel_or_unknown_are_pinned_to_cpu():
    costs = hand_net([(1, 0.1, False), (1, 0.1), (1, 0.1)], [("a", 0, [1], 0.1, 0.1)])
    costs.ops.loc[2, "known"] = False
    g = build_cost_graph(costs, pins={1: "gpu"})
    assert g.nodes[0]["pin"] == "cpu" and g.nodes[0]["pin_reason"] == "pinned: no GPU kernel"
    assert g.nodes[1]["pin"] == "gpu" and "--pin" in g.nodes[1]["pin_reason"]
    assert g.nodes[2]["pin"] == "cpu" and "unknown" in g.nodes[2]["pin_reason"]


def test_gpu_pin_on_an_op_without_kernel_is_refused():
    costs = hand_net([(1, 0.1, False)], [("a", -1, [0], 0.1, 0.1)])
    with pytest.raises(InfeasiblePlanError, match="op #0 FC 'op0' is pinned to the GPU but no GPU kernel"):
        build_cost_graph(costs, pins={0: "gpu"})


def test_colocation_and_inplace_pairs_are_recorded():
    costs = hand_net([(1, 1)] * 4, [("a", 0, [1], 0.1, 0.1)])
    g = build_cost_graph(costs, colocate=[{2, 0}], inplace=[(3, 1)])
    assert g.graph["colocate"] == [(0, 2), (1, 3)]
    assert from_graph(g).colocate.tolist() == [[0, 2], [1, 3]]


def test_arrays_from_graph_price_placements_like_the_generator():
    arr = random_arrays(300, seed=11)
    back = from_graph(build_cost_graph(to_net_costs(arr)))
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.random(300) < 0.5
        assert serial_cost(back, x).total_s == pytest.approx(serial_cost(arr, x).total_s, rel=1e-12)


def test_missing_columns_are_named():
    costs = hand_net([(1, 1)], [])
    costs.ops = costs.ops.drop(columns=["gpu_s"])
    with pytest.raises(ValueError, match="gpu_s"):
        build_cost_graph(costs)


def _same_arrays(a, b):
    """Every field of two CostArrays equal, dtypes included."""
    import dataclasses
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("seed", range(8))
def test_cost_arrays_equal_the_arrays_of_the_networkx_graph(seed):
    """The planner's bulk build is the graph's array form: same pins, readers, colocation."""
    rng = np.random.default_rng(seed)
    costs = to_net_costs(random_arrays(150, seed=seed))
    # readers listed twice and producers reading their own blob (in place) are dropped alike
    t = costs.tensors
    t["consumers"] = [list(cs) + list(cs[:1]) + ([p] if p >= 0 and k % 3 == 0 else [])
                      for k, (cs, p) in enumerate(zip(t["consumers"], t["producer"]))]
    free = np.flatnonzero(costs.ops["gpu_kernel"].to_numpy())
    pins = {int(i): str(rng.choice(["cpu", "gpu"])) for i in rng.choice(free, 6)}
    colocate = [set(rng.choice(150, 3).tolist()) for _ in range(4)]
    inplace = [tuple(rng.choice(150, 2).tolist()) for _ in range(4)]
    for outputs_on_host in (True, False):
        args = dict(pins=pins, colocate=colocate, inplace=inplace, outputs_on_host=outputs_on_host)
        _same_arrays(cost_arrays(costs, **args), from_graph(build_cost_graph(costs, **args)))


def test_cost_arrays_refuse_what_the_graph_refuses():
    costs = hand_net([(1, 0.1), (1, 0.1, False), (1, 0.1, False)], [("a", 0, [1], 0.1, 0.1)])
    for build in (cost_arrays, build_cost_graph):
        # the first conflicting op in net order is named, whatever order the pins come in
        with pytest.raises(InfeasiblePlanError, match="op #1 FC 'op1' is pinned to the GPU"):
            build(costs, pins={2: "gpu", 1: "gpu"})
        with pytest.raises(ValueError, match="must be 'cpu' or 'gpu'"):
            build(costs, pins={0: "tpu"})
