"""The k-device cost of a placement, its copies and its memory, on hand-built nets."""
from __future__ import annotations

import numpy as np
import pytest

from placer.partition.problem import (CostArrays, copy_pairs, device_memory, move_delta, move_deltas,
                                      plan_copies, respecting_pins, serial_cost)
from placer.partition.synthetic import random_small


def _hand_net(outputs_on_host=True):
    """cpu, cuda:0, cuda:1. Op 0 reads host input x (4 B) and makes a (100 B), read by ops
    1 and 2; op 1 makes b (10 B, an external output); op 2 makes c (20 B), read by op 3;
    op 3 reads parameter w (1000 B) and makes d (1 B, external output)."""
    link_class = np.array([[-1, 0, 0], [1, -1, 2], [1, 2, -1]])
    nbytes = np.array([100.0, 10.0, 20.0, 1.0, 4.0, 1000.0])   # a b c d x w
    class_s = np.stack([nbytes * 1e-3, nbytes * 2e-3, nbytes * 1e-4])   # h2d, d2h, peer
    return CostArrays(
        op_s=np.array([[1.0, 0.5, 0.5], [1.0, 0.2, 0.3], [1.0, 0.3, 0.2], [1.0, 0.4, 0.1]]),
        allowed=np.ones((4, 3), bool), param_bytes=np.array([0, 0, 0, 1000.0]),
        output_bytes=nbytes[:4].copy(), t_producer=np.array([0, 1, 2, 3, -1, -2]),
        t_ptr=np.array([0, 2, 2, 3, 3, 4, 5]), t_cons=np.array([1, 2, 3, 0, 3]),
        t_bytes=nbytes, t_ext_out=np.array([False, True, False, True, False, False]),
        link_class=link_class, class_s=class_s, devices=("cpu", "cuda:0", "cuda:1"),
        device_kinds=("cpu", "gpu", "gpu"), outputs_on_host=outputs_on_host)


def test_serial_cost_pays_each_copy_once_per_destination():
    arr = _hand_net()
    dev = np.array([1, 0, 2, 2])
    # x: cpu -> cuda:0 (4 B * 1e-3); a: cuda:0 -> cpu (100 * 2e-3) and cuda:0 -> cuda:1 (100 * 1e-4);
    # b made on cpu: no copy; c on cuda:1, read there; d: cuda:1 -> cpu (1 * 2e-3)
    cost = serial_cost(arr, dev)
    assert cost.compute_s == pytest.approx(0.5 + 1.0 + 0.2 + 0.1)
    assert cost.copy_s == pytest.approx(4e-3 + 0.2 + 0.01 + 2e-3)
    t, s, d = copy_pairs(arr, dev)
    assert list(zip(t.tolist(), s.tolist(), d.tolist())) == [(0, 1, 0), (0, 1, 2), (3, 2, 0), (4, 0, 1)]
    copies = {(c.tensor, c.src, c.dst): c for c in plan_copies(arr, dev)}
    assert copies[("t0", "cuda:0", "cpu")].consumers == (1,)
    assert copies[("t3", "cuda:1", "cpu")].consumers == (-1,)
    assert copies[("t0", "cuda:0", "cuda:1")].direction == "d2d"
    assert copies[("t4", "cpu", "cuda:0")].direction == "h2d"


def test_outputs_left_on_their_device_cost_no_copy_and_stay_live():
    arr = _hand_net(outputs_on_host=False)
    dev = np.array([1, 1, 1, 2])
    assert serial_cost(arr, dev).copy_s == pytest.approx(4e-3 + 20 * 1e-4)
    params, peak, step = device_memory(arr, dev)
    assert params.tolist() == [0.0, 0.0, 1000.0]
    # cuda:0: a (100) from step 0 to 2, b (10) from 1 to the end, c (20) from step 2 on;
    # x (4) copied in, read at step 0. Peak at step 2: 100 + 10 + 20
    assert peak[1] == 130.0 and step[1] == 2
    # cuda:1: c's copy (20) and d (1, kept to the end) at step 3
    assert peak[2] == 21.0


def test_device_memory_counts_parameters_on_every_device_that_reads_them():
    arr = _hand_net()
    arr.t_cons = np.array([1, 2, 3, 0, 3])
    dev = np.array([0, 0, 0, 1])
    params, peak, _ = device_memory(arr, dev)
    assert params.tolist() == [0.0, 1000.0, 0.0]
    # cpu holds x, a, b, c; the copy of c lives on cuda:0 at step 3 with d
    assert peak[1] == 21.0


def test_move_deltas_equal_single_moves_on_random_nets():
    rng = np.random.default_rng(7)
    for _ in range(60):
        arr = random_small(int(rng.integers(2, 12)), rng, gpus=int(rng.integers(1, 4)))
        dev = respecting_pins(arr, rng.integers(0, arr.k, arr.n_ops))
        for d in range(arr.k):
            fast = move_deltas(arr, dev, d)
            for i in range(arr.n_ops):
                slow = 0.0 if dev[i] == d else move_delta(arr, dev, [i], d)[0]
                moved = dev.copy()
                moved[i] = d
                assert fast[i] == pytest.approx(slow, abs=1e-12)
                assert slow == pytest.approx(serial_cost(arr, moved).total_s - serial_cost(arr, dev).total_s,
                                             abs=1e-12)


def test_respecting_pins_moves_ops_off_devices_they_may_not_take():
    arr = _hand_net()
    arr.allowed[2] = [True, False, False]
    assert respecting_pins(arr, [1, 1, 1, 2]).tolist() == [1, 1, 0, 2]


def test_a_net_without_blobs_holds_only_what_its_ops_write():
    """One op whose output nobody reads (an init net's fill planned as a net): no tensor
    in the table, its 50 bytes live on its device during its step only."""
    arr = CostArrays(op_s=np.array([[1.0, 0.5]]), allowed=np.ones((1, 2), bool), param_bytes=np.zeros(1),
                     output_bytes=np.array([50.0]), t_producer=np.zeros(0, np.int64), t_ptr=np.zeros(1, np.int64),
                     t_cons=np.zeros(0, np.int64), t_bytes=np.zeros(0), t_ext_out=np.zeros(0, bool),
                     link_class=np.array([[-1, 0], [1, -1]]), class_s=np.zeros((2, 0)),
                     devices=("cpu", "cuda:0"), device_kinds=("cpu", "gpu"))
    params, peak, step = device_memory(arr, [1])
    assert params.tolist() == [0.0, 0.0] and peak.tolist() == [0.0, 50.0] and step.tolist() == [0, 0]
    assert serial_cost(arr, [1]).total_s == 0.5 and plan_copies(arr, [1]) == []
