"""A sharded-embedding DLRM step equals the unsharded one.

A one-device train net (placer's train-net recipe, RowWiseSparseAdagrad on the tables,
Adagrad on the MLPs) on a global batch of G rows, against its sharded layout
(``placer.sharding.train_net``) over n emulated GPUs: each table whole on its owner GPU,
which looks up every sample's rows; the pooled outputs exchanged by AllToAll; each GPU
running the dense part on its G/n rows, its gradients all-reduced. After one step the
summed per-GPU losses (each scaled by 1/n) equal the one-device loss, and every table
(on its owner) and every dense parameter (on every GPU) equals the one-device one, to
float rounding. Layouts: two GPUs; four GPUs with a GPU that owns no table and tables
of different widths (zero-padded slots); a table left data-parallel among sharded ones.

Then every other layout over three steps (batches with repeated rows and empty
samples): row-wise (indices routed on the host, partial sums added), column-wise (Adagrad,
whose state is per element), host tables, uvm and uvm_caching tables (written as host
tables from the plan's records), and a plan mixing all of them, under several
optimizers; a column-wise table under RowWiseSparseAdagrad keeps a state per shard; bad
layouts are refused; the host side of a sharded net runs in real Caffe2.
"""
from __future__ import annotations

import numpy as np
import pytest

from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import net_from_netdef
from placer.runtime.executor import Executor
from placer.training.recipe import OptimizerChoice, make_train_nets
from placer.sharding.train_net import sharded
from placer.sharding.tables import TableLayout, TableShard, layout_of_option
from placer.sharding.types import COLUMN_WISE, HOST, ROW_WISE, TABLE_WISE

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


def run(train, init, feed: dict, outputs: list[str], iterations: int = 1, **kw) -> dict[str, np.ndarray]:
    train.external_output[:] = outputs
    ex = Executor(net_from_netdef(train, init), **kw)
    out = ex.run(feed, iterations=iterations, warmup=0)
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
    sfeed = {there: feed[one] for one, names in sh.table_inputs.items() for there in names}
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


def table(got: dict, sh, name: str, shape) -> np.ndarray:
    """A sharded table put back together from its shards."""
    whole = np.full(shape, np.nan, np.float32)
    for blob, shard in sh.shards[name]:
        whole[shard.rows[0]:shard.rows[1], shard.cols[0]:shard.cols[1]] = got[blob]
    return whole


def sharded_feed(feed: dict, sh, n: int, tables) -> dict:
    sfeed = {there: feed[one] for one, names in sh.table_inputs.items() for there in names}
    for d in range(n):
        sfeed[f"gpu_{d}/dense"] = feed["dense"][d * B:(d + 1) * B]
        sfeed[f"gpu_{d}/label"] = feed["label"][d * B:(d + 1) * B]
        for t in range(len(tables)):
            if f"emb{t}" not in sh.layouts:     # a data-parallel table: each GPU looks up its own rows
                lengths = feed[f"len{t}"]
                first, end = int(lengths[:d * B].sum()), int(lengths[:(d + 1) * B].sum())
                sfeed[f"gpu_{d}/idx{t}"] = feed[f"idx{t}"][first:end]
                sfeed[f"gpu_{d}/len{t}"] = lengths[d * B:(d + 1) * B]
    return sfeed


def batch(rng, G: int, tables) -> dict:
    """A global batch; indices repeat within a table (rows hit twice sum their gradients)
    and some samples look up nothing."""
    feed = {"dense": rng.standard_normal((G, 3)).astype(np.float32), "label": rng.integers(0, 2, G).astype(np.int32)}
    for t, (rows, _) in enumerate(tables):
        lengths = rng.integers(0, 2 * P + 1, G).astype(np.int32)
        feed[f"len{t}"] = lengths
        feed[f"idx{t}"] = rng.integers(0, rows, int(lengths.sum())).astype(np.int64)
    return feed


L = TableLayout
LAYOUTS = {
    "row-wise": (2, [(50, 4), (30, 4), (40, 4)],
                 {"emb0": L.row_wise([0, 1], 50, 4), "emb1": 0, "emb2": L.row_wise([1, 0], 40, 4)}),
    "row-wise over four GPUs, a short last block": (4, [(50, 4), (31, 2), (60, 4)],
                                                    {"emb0": L.row_wise([0, 1, 2, 3], 50, 4),
                                                     "emb1": L.row_wise([3, 2, 1, 0], 31, 2), "emb2": 1}),
    "row-wise over two of four GPUs (one host's, on a cluster)": (4, [(50, 4), (30, 4), (40, 4)],
                                                                  {"emb0": ("row_wise", "hbm", [3, 1]), "emb1": 1}),
    "host": (2, [(50, 4), (30, 4), (40, 4)], {"emb0": L.host(50, 4), "emb1": 1}),
    "uvm": (2, [(50, 4), (30, 4), (40, 4)], {"emb0": ("table_wise", "uvm", [1]), "emb1": 0}),
    "uvm_caching": (2, [(50, 4), (30, 4), (40, 4)], {"emb0": ("row_wise", "uvm_caching", [0, 1]),
                                                     "emb2": ("table_wise", "hbm", [1])}),
    # column shards keep their own optimizer state over their columns: Adagrad's is per
    # element, so the step is the one-device step (RowWise's is not: test below)
    "column-wise": (2, [(50, 4), (30, 4), (40, 4)], {"emb0": L.column_wise([0, 1], 50, 4),
                                                    "emb1": L.column_wise([1, 1], 30, 4), "emb2": 0}, "adagrad"),
    "column-wise over four GPUs, padded slots": (4, [(50, 4), (30, 2), (60, 6)],
                                                 {"emb0": ("column_wise", "hbm", [3, 1]), "emb1": 3,
                                                  "emb2": L.column_wise([0, 2, 3], 60, 6)}, "adagrad"),
    "every layout in one plan": (4, [(50, 4), (31, 2), (60, 6), (40, 4), (20, 4), (30, 4), (25, 2)],
                                 {"emb0": L.row_wise([2, 0, 3, 1], 50, 4), "emb1": 1,
                                  "emb2": L.column_wise([3, 0, 3], 60, 6), "emb3": L.host(40, 4),
                                  "emb4": ("table_wise", "uvm", [2]), "emb5": ("column_wise", "uvm_caching", [0, 1])},
                                 "adagrad"),
}


def _layouts(spec: dict, tables) -> dict:
    """Layouts as given, or through the plan's records (sharding type, kernel, GPUs): what
    ``placer shard -o`` writes for a plan's option."""
    from placer.sharding.types import Shard, ShardingOption
    out = {}
    for name, v in spec.items():
        if isinstance(v, tuple):
            rows, dim = tables[int(name[3:])]
            k = len(v[2])       # the planner's shards: row blocks of ceil(rows / k), or equal columns
            block, width = (-(-rows // k), dim) if v[0] == "row_wise" else (rows, dim // k)
            shards = tuple(Shard(r, block, width, i * block if v[0] == "row_wise" else 0,
                                 i * width if v[0] == "column_wise" else 0) for i, r in enumerate(v[2]))
            option = ShardingOption(name, v[0], v[1], shards, tuple(v[2]), host=9 if v[1] != "hbm" else -1)
            v = layout_of_option(option, list(range(8)), (rows, dim))
        out[name] = v
    return out


CASES_3 = [(case, None) for case in LAYOUTS] + [("every layout in one plan", o) for o in ("sgd", "momentum", "adam")]


@pytest.mark.parametrize("case,other_optimizer", CASES_3)
def test_each_layout_trains_as_the_unsharded_net_over_three_steps(case, other_optimizer):
    n, tables, spec, *optimizer = LAYOUTS[case]
    optimizer = [other_optimizer] if other_optimizer else optimizer
    G = n * B
    rng = np.random.default_rng(1)
    net = dlrm(rng, tables, G)
    nets = make_train_nets(net, ["loss"], OptimizerChoice((optimizer or ["rowwise-adagrad"])[0], lr=0.1))
    feed = batch(rng, G, tables)
    steps = 3
    want, _ = run(nets.train, nets.init, feed, ["loss"] + nets.params, iterations=steps)
    layouts = _layouts(spec, tables)
    sh = sharded(nets.train, nets.init, layouts, n, G)
    shapes = dict(zip([f"emb{t}" for t in range(len(tables))], tables))
    outputs = [f"gpu_{d}/loss" for d in range(n)] + [b for t in sh.shards for b, _ in sh.shards[t]]
    outputs += [f"gpu_{d}/{p}" for d in range(n) for p in sh.replicated]
    got, record = run(sh.train, sh.init, sharded_feed(feed, sh, n, tables), outputs, emulate_gpus=n,
                      iterations=steps)

    # Tolerances. The sharded step adds the same float32 terms in another order: a pooled
    # row as partial sums of its shards, the dense gradients as n per-GPU sums all-reduced
    # (at most G = 12 terms each), the loss as n scaled parts. A reordered sum of K terms
    # moves by at most K * 2^-24 of the sum of their magnitudes (K <= 12: ~7e-7 relative).
    # An Adagrad (Adam) step lr * g / (sqrt(m) + eps), m accumulating g^2, at most doubles
    # the relative error of g (SGD and momentum pass it on as it is); three steps add three
    # such errors: a few 1e-6 relative on
    # parameters of size ~0.3, inside rtol 2e-5 + atol 2e-6 (the worst element measured
    # uses 3% of it), while a row or sample routed to the wrong shard moves a parameter by
    # ~lr = 0.1. The loss is a sum of n parts of G / n terms: rel 1e-5 (measured < 1e-7).
    assert sum(float(got[f"gpu_{d}/loss"]) for d in range(n)) == pytest.approx(float(want["loss"]), rel=1e-5)
    for p in nets.params:
        if p in sh.shards:
            np.testing.assert_allclose(table(got, sh, p, shapes[p]), want[p], rtol=2e-5, atol=2e-6, err_msg=p)
            assert not np.allclose(want[p].ravel(), initial(nets.init, p))     # the steps moved every table
        else:
            for d in range(n):
                np.testing.assert_allclose(got[f"gpu_{d}/{p}"], want[p], rtol=2e-5, atol=2e-6, err_msg=f"{d}/{p}")
    kinds = {t: lay.kind for t, lay in sh.layouts.items()}
    on_cpu = sorted(sh.train.op[o.index].input[0] for o in record.ops
                    if o.type == "SparseLengthsSum" and not o.device.startswith("emulated-cuda"))
    assert on_cpu == sorted(t for t, k in kinds.items() if k == "host")    # host lookups on the CPU, the rest on GPUs
    pieces = [s.device for t, lay in sh.layouts.items() if lay.kind != "host" for s in lay.shards]
    slots = max((pieces.count(d) for d in range(n)), default=0)     # one lookup per table: a piece per GPU shard
    assert sum(o.type == "AllToAll" for o in record.ops) == 2 * slots   # forward and back
    routed = [o for o in record.ops if o.type == "LengthsPartition"]
    assert len(routed) == sum(k == "row_wise" for k in kinds.values()) and all(o.device == "cpu" for o in routed)
    notes = {t: lay.note for t, lay in sh.layouts.items() if lay.note}
    uvm = [t for t, v in spec.items() if isinstance(v, tuple) and v[1] != "hbm"]
    assert sorted(notes) == sorted(uvm)
    assert all("Caffe2 has no unified memory" in note for note in notes.values())
    named = [t for n in sh.notes if "unified memory" in n for t in n.partition(": ")[0].split(", ")]
    assert sorted(named) == sorted(uvm)         # each uvm table in one note line


def test_column_shards_of_a_rowwise_optimizer_keep_their_own_row_state():
    """RowWiseSparseAdagrad adds mean(g^2) over a row's columns to the row's state at every
    occurrence of its index; a column shard adds the mean over its own columns. After one
    step (the same gradients: no update before it) the one-device state is the shards'
    states weighted by their widths, and the note says the steps differ."""
    n, tables = 2, [(50, 4), (30, 4)]
    G = n * B
    rng = np.random.default_rng(2)
    net = dlrm(rng, tables, G)
    nets = make_train_nets(net, ["loss"], OptimizerChoice("rowwise-adagrad", lr=0.1))
    feed = batch(rng, G, tables)
    want, _ = run(nets.train, nets.init, feed, ["loss", "emb0", "emb0_avg_squared_sum"])
    layout = TableLayout.column_wise([1, 0], 50, 4)
    sh = sharded(nets.train, nets.init, {"emb0": layout, "emb1": 0}, n, G)
    states = [layout.blob("emb0_avg_squared_sum", s) for s in layout.shards]
    got, _ = run(sh.train, sh.init, sharded_feed(feed, sh, n, tables),
                 [f"gpu_{d}/loss" for d in range(n)] + states + [b for b, _ in sh.shards["emb0"]], emulate_gpus=n)
    assert sum(float(got[f"gpu_{d}/loss"]) for d in range(n)) == pytest.approx(float(want["loss"]), rel=1e-5)
    widths = [s.cols[1] - s.cols[0] for s in layout.shards]
    mixed = sum(w / 4 * got[b] for w, b in zip(widths, states))
    np.testing.assert_allclose(mixed, want["emb0_avg_squared_sum"], rtol=1e-5, atol=1e-9)  # float32 means of 2-4 terms
    assert not np.allclose(got[states[0]], got[states[1]])       # the shards' states differ: their steps do
    assert sh.notes == [note for note in sh.notes if note.startswith("emb0: column-wise under a row-wise")]
    assert len(sh.notes) == 1 and "differ" in sh.notes[0]


@pytest.mark.parametrize("fill,kind,args", [
    ("UniformFill", "row_wise", {"min": -0.1, "max": 0.1}), ("UniformFill", "column_wise", {"min": -0.1, "max": 0.1}),
    ("GaussianFill", "column_wise", {"std": 0.1}), ("XavierFill", "row_wise", {}), ("XavierFill", "column_wise", {}),
    ("MSRAFill", "column_wise", {})])
def test_a_shard_is_filled_as_its_block_of_the_table(fill, kind, args):
    """A random fill takes the shard's shape where its distribution stays the table's
    (Xavier and MSRA scale by the fan-in, shape[1:]: a column block would change it); else
    the whole table is filled on the shard's device and Slice cuts the block."""
    from placer.formats import caffe2_pb as pb
    from placer.formats.caffe2 import params_from_init
    from placer.training.gradient_registry import make_op
    from placer.sharding.tables import shard_fill_ops
    op = make_op(fill, [], ["emb"], shape=[10, 6], **args)
    init = pb.NetDef()
    init.op.append(op)
    layout = (L.row_wise if kind == "row_wise" else L.column_wise)([1, 0], 10, 6)
    ops = shard_fill_ops([op], "emb", layout, {"emb"}, params_from_init(init))
    blocks = [((0, 5), (0, 6)), ((5, 10), (0, 6))] if kind == "row_wise" else [((0, 10), (0, 3)), ((0, 10), (3, 6))]
    whole = fill in ("XavierFill", "MSRAFill") and kind == "column_wise"
    assert len(ops) == (4 if whole else 2)
    for shard, (rows, cols) in zip(layout.shards, blocks):
        mine = [o for o in ops if o.device_option.device_id == shard.device]
        assert mine[-1].output[0] == layout.blob("emb", shard) and (shard.rows, shard.cols) == (rows, cols)
        assert all(o.device_option.device_type == 1 for o in mine)
        shape = [rows[1] - rows[0], cols[1] - cols[0]]
        got = {a.name: list(a.ints) for o in mine for a in o.arg}
        if whole:
            assert [o.type for o in mine] == [fill, "Slice"] and got["shape"] == [10, 6]
            assert (got["starts"], got["ends"]) == ([rows[0], cols[0]], [rows[1], cols[1]])
        else:
            assert [o.type for o in mine] == [fill] and got["shape"] == shape


S = TableShard
BAD_LAYOUTS = [
    (L(COLUMN_WISE, (S(0, (0, 50), (0, 2)), S(1, (0, 50), (1, 3)))), "column blocks side by side"),
    (L(COLUMN_WISE, (S(0, (0, 50), (0, 2)),)), "covering the table"),
    (L(ROW_WISE, (S(0, (0, 25), (0, 4)), S(1, (25, 49), (0, 4)))), "blocks of 25 rows"),
    (L(ROW_WISE, (S(1, (25, 50), (0, 4)), S(0, (0, 25), (0, 4)))), "in row order"),
    (L(ROW_WISE, (S(0, (0, 25), (0, 4)), S(1, (25, 50), (0, 3)))), "blocks of 25 rows"),
    (L(TABLE_WISE, (S(0, (0, 40), (0, 4)),)), "one shard of the whole table"),
    (L(TABLE_WISE, (S(3, (0, 50), (0, 4)),)), "outside GPUs 0..1"),
    (L(HOST, (S(0, (0, 50), (0, 4)),)), "sits on the CPU"),
]


@pytest.mark.parametrize("layout,needle", BAD_LAYOUTS)
def test_a_layout_that_does_not_tile_its_table_is_refused(layout, needle):
    from placer.training.data_parallel import DataParallelError
    nets = make_train_nets(dlrm(np.random.default_rng(0), [(50, 4)], 2 * B), ["loss"],
                           OptimizerChoice("rowwise-adagrad", lr=0.1))
    with pytest.raises(DataParallelError, match=needle):
        sharded(nets.train, nets.init, {"emb0": layout}, 2, 2 * B)


HOST_SIDE = """
from google.protobuf import text_format
net, init = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
text_format.Parse(inputs.pop("net").tobytes().decode(), net)
text_format.Parse(inputs.pop("init").tobytes().decode(), init)
workspace.RunNetOnce(init)
for name, value in inputs.items():
    workspace.FeedBlob(name, value)
workspace.RunNetOnce(net)
save(**{b: workspace.FetchBlob(b) for b in net.external_output})
"""


@pytest.mark.caffe2
def test_the_host_side_of_a_sharded_net_runs_in_caffe2():
    """The CPU ops of the forward pass (a row-wise table's routing, a host table's lookup
    and Split) are Caffe2's: real Caffe2 gives what placer's runtime gives."""
    from caffe2_oracle import run_caffe2
    from google.protobuf import text_format
    from placer.formats import caffe2_pb as pb
    n, tables = 4, [(50, 4), (30, 4), (40, 4)]
    G = n * B
    rng = np.random.default_rng(3)
    nets = make_train_nets(dlrm(rng, tables, G), ["loss"], OptimizerChoice("rowwise-adagrad", lr=0.1))
    sh = sharded(nets.train, nets.init, {"emb0": L.row_wise([1, 0, 3, 2], 50, 4), "emb1": L.host(30, 4)}, n, G)
    feed = batch(rng, G, tables)
    cpu = pb.NetDef(name="host_side")
    backward = next(i for i, op in enumerate(sh.train.op) if op.output[0].endswith("/loss_grad"))   # the seeds
    cpu.op.extend(op for op in sh.train.op[:backward] if op.device_option.device_type == 0)
    made = {b for op in cpu.op for b in op.output}
    cpu.external_input[:] = list(dict.fromkeys(b for op in cpu.op for b in op.input if b not in made))
    cpu.external_output[:] = [b for op in cpu.op for b in op.output if not b.endswith("_route_block")]
    assert {"LengthsPartition", "Div", "Mul", "Sub", "SparseLengthsSum", "Split"} <= {op.type for op in cpu.op}
    init = pb.NetDef(name="host_init")
    init.op.extend(op for op in nets.init.op if op.output[0] == "emb1")
    fed = {b: feed[b.partition("/")[2]] for b in cpu.external_input if b.startswith("cpu_0/")}
    want, _ = run_caffe2(HOST_SIDE, {"net": np.frombuffer(text_format.MessageToString(cpu).encode(), np.uint8),
                                     "init": np.frombuffer(text_format.MessageToString(init).encode(), np.uint8),
                                     **fed})
    got, _ = run(cpu, init, fed, list(cpu.external_output))
    assert sorted(want) == sorted(got)
    for b in want:
        assert want[b].dtype == got[b].dtype, b
        # integer routing exactly; the host lookup sums 0..4 float32 rows in the same order
        np.testing.assert_allclose(got[b], want[b], rtol=1e-6, atol=1e-7, err_msg=b)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_the_gradient_of_an_alltoall_is_the_alltoall_of_its_gradients(ranks):
    """<G, AllToAll(X)> = <AllToAll(G), X> for every X and G: the maker's op is the adjoint."""
    from placer.ops import registry
    from placer.training.gradient_registry import make_op
    from placer.training.gradients import gradient_for_op
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
