"""The cost graph: attributes, edges per tensor, restrictions, round trip to arrays."""
import numpy as np
import pytest

from placer.costs.graph import build_cost_graph
from placer.partition.problem import from_graph, serial_cost
from placer.partition.synthetic import random_arrays, to_net_costs

from partition_cases import hand_net_costs


def _graph(arr, peer="mixed", **kw):
    return build_cost_graph(to_net_costs(arr, peer), arr.allowed, arr.pin_reason, **kw)


def test_nodes_and_edges_follow_the_tables():
    arr = random_arrays(60, seed=3)
    costs = to_net_costs(arr)
    g = build_cost_graph(costs, arr.allowed, arr.pin_reason)
    assert g.number_of_nodes() == 60
    node = g.nodes[7]
    assert node["time_s"] == pytest.approx(tuple(arr.op_s[7]))
    assert node["name"] == "op7" and node["type"] == "FC"
    t = costs.tensors
    pairs = set()
    for x in range(len(t)):
        p = int(t.producer[x])
        for c in t.readers(x).tolist():
            if p >= 0:
                assert t.names[x] in g.edges[p, c]["tensors"]
                pairs.add((p, c))
    assert g.number_of_edges() == len(pairs)
    assert g.graph["tensors"] is t
    assert g.graph["devices"] == ("cpu", "cuda:0") and g.graph["device_kinds"] == ("cpu", "gpu")
    assert g.graph["host"] == 0 and g.graph["outputs_on_host"] is True
    assert np.all(np.isinf(g.graph["capacity"]))


def test_edge_sums_two_tensors_between_the_same_ops():
    costs = hand_net_costs([(1, 1), (1, 1)], [("a", 0, [1], 1e6), ("b", 0, [1], 3e6)])
    g = build_cost_graph(costs, np.ones((2, 2), bool))
    e = g.edges[0, 1]
    assert e["tensors"] == ("a", "b") and e["bytes"] == 4e6
    # copies are priced per tensor from the machine's links, not per edge
    arr = from_graph(g)
    machine = costs.machine
    for t, nbytes in enumerate((1e6, 3e6)):
        assert arr.copy_s(t, 0, 1) == pytest.approx(machine.copy_time(nbytes, 0, 1), rel=1e-12)
        assert arr.copy_s(t, 1, 0) == pytest.approx(machine.copy_time(nbytes, 1, 0), rel=1e-12)


def test_restrictions_are_recorded_per_op():
    costs = hand_net_costs([(1, 0.1, False), (1, 0.1), (1, 0.1)], [("a", 0, [1], 1e6)])
    allowed = np.array([[True, False], [False, True], [True, True]])
    why = ["pinned: no GPU kernel", "pinned: --pin cuda:0", ""]
    g = build_cost_graph(costs, allowed, why)
    assert [g.nodes[i]["allowed"] for i in range(3)] == [(0,), (1,), (0, 1)]
    assert [g.nodes[i]["pin_reason"] for i in range(3)] == why
    arr = from_graph(g)
    assert arr.allowed.tolist() == allowed.tolist() and arr.forced.tolist() == [0, 1, -1]


def test_allowed_of_the_wrong_shape_is_refused():
    costs = hand_net_costs([(1, 1)], [])
    with pytest.raises(ValueError, match=r"allowed has shape \(1, 3\), expected \(1, 2\)"):
        build_cost_graph(costs, np.ones((1, 3), bool))


def test_colocation_and_inplace_pairs_are_recorded():
    costs = hand_net_costs([(1, 1)] * 4, [("a", 0, [1], 1e6)])
    g = build_cost_graph(costs, np.ones((4, 2), bool), colocate=[{2, 0}], inplace=[(3, 1)])
    assert g.graph["colocate"] == [(0, 2), (1, 3)]
    assert from_graph(g).colocate.tolist() == [[0, 2], [1, 3]]


def test_an_op_reading_the_blob_it_overwrites_needs_no_copy_of_it():
    # op 1 reads 'a' (made by op 0) and writes it in place: it is not a reader that needs a copy
    costs = hand_net_costs([(1, 1), (1, 1)], [("a", 0, [1], 1e6), ("a", 1, [1], 1e6, True)])
    arr = from_graph(build_cost_graph(costs, np.ones((2, 2), bool)))
    assert arr.t_cons.tolist() == [1] and arr.t_ptr.tolist() == [0, 1, 1]


@pytest.mark.parametrize("gpus, peer", [(1, "mixed"), (3, "mixed"), (2, "staged")])
def test_arrays_from_graph_price_placements_like_the_generator(gpus, peer):
    arr = random_arrays(300, seed=11, gpus=gpus, peer=peer)
    back = from_graph(_graph(arr, peer))
    rng = np.random.default_rng(0)
    for _ in range(5):
        dev = rng.integers(0, arr.k, 300)
        assert serial_cost(back, dev).total_s == pytest.approx(serial_cost(arr, dev).total_s, rel=1e-12)
    assert back.allowed.tolist() == arr.allowed.tolist()


def test_the_synthetic_tables_must_match_the_peer_links():
    arr = random_arrays(40, seed=2, gpus=3, peer="nvlink")
    with pytest.raises(ValueError, match="not priced as on synthetic_machine"):
        to_net_costs(arr, "mixed")

