"""The essentials of the training answers (README "Training", reports/TRAINING.md).

- word2vec (bundled ``word2vec_train``: a 10M x 300 table trained by SparseAdagrad): on a
  16 GB GPU the table, its lookup and its sparse update stay on the CPU because the table
  and its squared sums do not fit (given the memory, they move to the GPU), and only rows
  cross PCIe; on an A100 40 GB the whole step is on the GPU.
- The MLPerf terabyte DLRM trained with RowWiseSparseAdagrad: the plan fits within one
  V100 16 GB and one A100 40 GB with the optimizer state counted, every table sits with
  its lookup and its update, and the tables left on the CPU are the largest ones.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from placer.examples import DATA, train_nets, word2vec
from placer.formats import load_net
from placer.hardware.machine import compose_machine
from placer.partition.problem import memory_use
from placer.planning.planner import PlanOptions, plan
from placer.hardware.profiles import load_device_profile
from placer.shapes import infer, require_complete
from placer.types import DATA_TYPE_TO_DTYPE, TensorType

GIB = 2.0 ** 30


def machine(gpu: str):
    return compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile(gpu, "gpu"))


def bundled(stem: str):
    spec = json.loads((DATA / f"{stem}.value_info.json").read_text())
    shapes = {k: TensorType(tuple(s), DATA_TYPE_TO_DTYPE[t]) for k, (t, s) in spec.items()}
    net = load_net(DATA / f"{stem}.pbtxt", init_path=DATA / f"{stem}_init.pbtxt", input_shapes=shapes)
    return require_complete(infer(net, shapes))


@pytest.fixture(scope="module")
def w2v():
    return bundled("word2vec_train")


def op_of(typed, op_type: str) -> int:
    return next(op.index for op in typed.net.ops if op.type == op_type)


def test_the_bundled_train_nets_are_what_the_generator_makes(tmp_path):
    for name, make in train_nets.builders().items():
        paths = train_nets.save(make(), tmp_path, name)
        for key, path in paths.items():
            shipped = DATA / path.name
            assert shipped.read_text() == path.read_text(), f"{shipped} is stale: run python -m placer.examples"


@pytest.mark.parametrize("gpu", ["t4-pcie3", "v100-16gb-pcie3"])
def test_word2vec_keeps_its_table_on_the_cpu_of_a_16gb_gpu_because_it_does_not_fit(w2v, gpu):
    cfg = word2vec.Word2VecConfig()
    table = 4 * cfg.rows * cfg.dim
    r = plan(w2v, machine(gpu))
    p = r.plan
    lookup, update = op_of(w2v, "SparseLengthsSum"), op_of(w2v, "SparseAdagrad")
    assert p.device_of(lookup) == p.device_of(update) == "cpu"
    assert p.device_of(op_of(w2v, "FCGradient")) == "cuda:0"
    # the reason: the table and its squared sums (2 x 11.2 GiB) exceed the usable GPU memory
    usable = r.usable_bytes[1]
    assert 2 * table > usable
    assert not (memory_use(r.arrays, r.baselines["all_gpu"].placement) <= r.arrays.capacity).all()
    assert memory_use(r.arrays, p.placement)[0] >= 2 * table
    # only rows cross PCIe: the looked-up sums up, the gradient rows back; never the table
    copies = {(c.tensor, c.src, c.dst): c.nbytes for c in p.copies}
    assert copies[("context_sum", "cpu", "cuda:0")] == cfg.batch * cfg.dim * 4
    assert copies[("emb_w_grad_values", "cuda:0", "cpu")] == cfg.batch * cfg.window * cfg.dim * 4
    assert not any(name == "emb_w" for name, _, _ in copies)
    # with the memory to hold both, the same GPU takes the table, its lookup and its update
    roomy = plan(w2v, machine(gpu), PlanOptions(gpu_mem_bytes=40 * GIB)).plan
    assert roomy.device_of(lookup) == roomy.device_of(update) == "cuda:0"
    assert roomy.total_s < p.total_s


def test_word2vec_trains_on_an_a100_40gb(w2v):
    r = plan(w2v, machine("a100-40gb-pcie4"))
    p = r.plan
    on_cpu = [w2v.net.ops[i].type for i in p.ops_on("cpu")]
    assert on_cpu == ["AtomicIter"]                     # no GPU kernel in Caffe2
    cfg = word2vec.Word2VecConfig()
    assert memory_use(r.arrays, p.placement)[1] >= 2 * 4 * cfg.rows * cfg.dim   # table + squared sums


@pytest.mark.parametrize("gpu", ["v100-16gb-pcie3", "a100-40gb-pcie4"])
def test_terabyte_dlrm_trains_within_one_gpu_with_its_optimizer_state(gpu):
    typed = bundled("dlrm_criteo_1tb_train")
    net = typed.net
    r = plan(typed, machine(gpu))
    p, arr = r.plan, r.arrays
    used = memory_use(arr, p.placement)
    assert (used <= arr.capacity * (1 + 1e-12)).all()
    assert not (memory_use(arr, r.baselines["all_gpu"].placement) <= arr.capacity).all()
    tables = []
    for op in net.ops:
        if op.type == "SparseLengthsSum":
            name = op.inputs[0]
            update = next(u for u in net.ops if name in u.outputs)
            assert update.type == "RowWiseSparseAdagrad"
            state = next(b for b in update.outputs if b != name)
            assert typed.blobs[state].shape == (typed.blobs[name].shape[0],)      # one float per row
            assert p.device_of(op.index) == p.device_of(update.index)
            tables.append((typed.blobs[name].nbytes + typed.blobs[state].nbytes, p.device_of(update.index)))
    on_gpu = [b for b, d in tables if d == "cuda:0"]
    on_cpu = [b for b, d in tables if d == "cpu"]
    assert len(tables) == 26 and on_cpu and len(on_gpu) >= 20
    assert min(on_cpu) > max(on_gpu)                     # the largest tables stay on the host
    assert used[1] >= sum(on_gpu)                        # tables and their state counted on the GPU
    assert p.total_s * 10 < r.baselines["all_cpu"].total_s
