"""A sharded-embedding DLRM step equals the unsharded one.

A one-device train net (placer's train-net recipe, RowWiseSparseAdagrad on the tables,
Adagrad on the MLPs) on a global batch of G rows, against its sharded layout
(``placer.training.sharded``) over n emulated GPUs: each table whole on its owner GPU,
which looks up every sample's rows; the pooled outputs exchanged by AllToAll; each GPU
running the dense part on its G/n rows, its gradients all-reduced. After one step the
summed per-GPU losses (each scaled by 1/n) equal the one-device loss, and every table
(on its owner) and every dense parameter (on every GPU) equals the one-device one, to
float rounding. Layouts: two GPUs; four GPUs with a GPU that owns no table and tables
of different widths (zero-padded slots); a table left data-parallel among sharded ones.
"""
from __future__ import annotations

import numpy as np
import pytest

from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import net_from_netdef
from placer.runtime.executor import Executor
from placer.training.recipe import OptimizerChoice, make_train_nets
from placer.training.sharded import sharded

B, P = 3, 2        # rows per GPU, lookups per sample


def given(b: NetBuilder, name: str, shape, rng, scale: float = 0.3) -> str:
    values = (rng.standard_normal(int(np.prod(shape))) * scale).astype(np.float32)
    return b.param(name, shape, "GivenTensorFill", values=[float(v) for v in values])


def dlrm(rng, tables, rows_total: int):
    """Tables read by SparseLengthsSum beside a dense FC, concatenated, FC, SoftmaxWithLoss."""
    b = NetBuilder("dlrm")
    b.input("dense", (rows_total, 3))
    b.input("label", (rows_total,), "int32")
    pooled = []
    for t, (rows, dim) in enumerate(tables):
        b.input(f"idx{t}", (rows_total * P,), "int64")
        b.input(f"len{t}", (rows_total,), "int32")
        pooled.append(b.op("SparseLengthsSum", [given(b, f"emb{t}", (rows, dim), rng), f"idx{t}", f"len{t}"],
                           f"pooled{t}"))
    dense = b.op("FC", ["dense", given(b, "bot_w", (4, 3), rng), given(b, "bot_b", (4,), rng)], "bot")
    both = b.op("Concat", pooled + [dense], ["both", "both_dims"], axis=1)
    width = 4 + sum(d for _, d in tables)
    top = b.op("FC", [both, given(b, "top_w", (2, width), rng), given(b, "top_b", (2,), rng)], "top")
    b.op("SoftmaxWithLoss", [top, "label"], ["softmax", "loss"])
    return net_from_netdef(b.predict, b.init)


def run(train, init, feed: dict, outputs: list[str], **kw) -> dict[str, np.ndarray]:
    train.external_output[:] = outputs
    ex = Executor(net_from_netdef(train, init), **kw)
    out = ex.run(feed, iterations=1, warmup=0)
    return out, ex.record


def initial(init, name: str) -> np.ndarray:
    op = next(op for op in init.op if name in op.output)
    return np.array(next(a for a in op.arg if a.name == "values").floats, np.float32)


CASES = {"two GPUs": (2, [(50, 4), (30, 4), (40, 4)], {"emb0": 1, "emb1": 0, "emb2": 1}),
         "four GPUs, padded slots, an idle GPU": (4, [(50, 4), (30, 2), (60, 4)], {"emb0": 3, "emb1": 3, "emb2": 0}),
         "a data-parallel table among sharded ones": (2, [(50, 4), (30, 4), (40, 4)], {"emb0": 1, "emb2": 0})}


@pytest.mark.parametrize("case", list(CASES))
def test_a_sharded_step_gives_the_unsharded_loss_and_parameters(case):
    n, tables, owners = CASES[case]
    G = n * B
    rng = np.random.default_rng(0)
    net = dlrm(rng, tables, G)
    nets = make_train_nets(net, ["loss"], OptimizerChoice("rowwise-adagrad", lr=0.1))
    feed = {"dense": rng.standard_normal((G, 3)).astype(np.float32), "label": rng.integers(0, 2, G).astype(np.int32)}
    for t, (rows, _) in enumerate(tables):
        feed[f"idx{t}"] = rng.permutation(rows)[:G * P].astype(np.int64)  # rows distinct: slices in any order
        feed[f"len{t}"] = np.full(G, P, np.int32)
    want, _ = run(nets.train, nets.init, feed, ["loss"] + nets.params)

    sh = sharded(nets.train, nets.init, owners, n, G)
    assert sorted(sh.replicated) == sorted(p for p in nets.params if p not in owners)
    sfeed = {there: feed[one] for one, there in sh.table_inputs.items()}
    for d in range(n):
        sfeed[f"gpu_{d}/dense"] = feed["dense"][d * B:(d + 1) * B]
        sfeed[f"gpu_{d}/label"] = feed["label"][d * B:(d + 1) * B]
        for t in range(len(tables)):
            if f"emb{t}" not in owners:        # a data-parallel table: each GPU looks up its own rows
                sfeed[f"gpu_{d}/idx{t}"] = feed[f"idx{t}"][d * B * P:(d + 1) * B * P]
                sfeed[f"gpu_{d}/len{t}"] = feed[f"len{t}"][d * B:(d + 1) * B]
    outputs = [f"gpu_{d}/loss" for d in range(n)] + list(owners) + [f"gpu_{d}/{p}" for d in range(n)
                                                                     for p in sh.replicated]
    got, record = run(sh.train, sh.init, sfeed, outputs, emulate_gpus=n)

    assert sum(float(got[f"gpu_{d}/loss"]) for d in range(n)) == pytest.approx(float(want["loss"]), rel=1e-6)
    for p in nets.params:
        for name in ([p] if p in owners else [f"gpu_{d}/{p}" for d in range(n)]):
            np.testing.assert_allclose(got[name], want[p], rtol=2e-5, atol=2e-6, err_msg=name)
    for p in owners:
        assert not np.allclose(want[p].ravel(), initial(nets.init, p))         # the step moved every table
    alltoall = [o for o in record.ops if o.type == "AllToAll"]
    assert len(alltoall) == 2 * max(list(owners.values()).count(d) for d in range(n))   # slots, forward and back
    assert all(o.device.startswith("emulated-cuda") for o in alltoall)
    lookups = sorted(o.device for o in record.ops if o.type == "SparseLengthsSum")
    data_parallel = [d for _ in range(len(tables) - len(owners)) for d in range(n)]   # one lookup per GPU each
    assert lookups == sorted(f"emulated-cuda:{d}" for d in list(owners.values()) + data_parallel)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_the_gradient_of_an_alltoall_is_the_alltoall_of_its_gradients(ranks):
    """<G, AllToAll(X)> = <AllToAll(G), X> for every X and G: the maker's op is the adjoint."""
    from placer.ops import registry
    from placer.training.gradients import gradient_for_op, make_op
    from placer.types import Args
    rng = np.random.default_rng(ranks)
    xs = [rng.standard_normal((ranks * 2, 3)) for _ in range(ranks)]
    gs = [rng.standard_normal((ranks * 2, 3)) for _ in range(ranks)]
    forward = make_op("AllToAll", [f"x{i}" for i in range(ranks)], [f"y{i}" for i in range(ranks)])
    ops, g_in = gradient_for_op(forward, [f"y{i}_grad" for i in range(ranks)])
    assert [op.type for op in ops] == ["AllToAll"] and list(ops[0].input) == [f"y{i}_grad" for i in range(ranks)]
    assert g_in == [f"x{i}_grad" for i in range(ranks)]
    kernel = registry.get("AllToAll").kernel
    ys, dxs = kernel(np, xs, Args({})), kernel(np, gs, Args({}))
    assert sum(float((g * y).sum()) for g, y in zip(gs, ys)) == pytest.approx(
        sum(float((d * x).sum()) for d, x in zip(dxs, xs)), rel=1e-12)
