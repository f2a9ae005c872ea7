"""The GPT-2-style example (placer/examples/gpt2.py): its size, its shapes, its forward pass
in placer and in real Caffe2 against a float64 reference, its train net training, and the
plan of gpt2-small on one GPU.

The reference forward pass below is written from the GPT-2 equations in numpy float64,
independently of placer's kernels and of the net's ops.
"""
from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from google.protobuf import text_format
from test_plan_cli import strict_json

from placer import cli, examples
from placer.examples import gpt2
from placer.formats.caffe2 import load_netdef, net_from_netdef
from placer.runtime.executor import Executor
from placer.shapes import infer
from placer.types import TensorType

U32 = 2.0 ** -24          # float32 unit roundoff
TINY = gpt2.preset("gpt2-tiny")


def count_fills(b) -> int:
    """Parameters the init net fills, counted from the fill ops' shapes."""
    return sum(math.prod(a.ints) for op in b.init.op for a in op.arg if a.name == "shape")


def input_types(b) -> dict:
    return {k: TensorType(tuple(s), dt) for k, (dt, s) in b.value_info.items()}


# ---------------------------------------------------------------- size and shapes

@pytest.mark.parametrize("name", list(gpt2.PRESETS))
def test_the_init_net_fills_the_closed_form_count(name):
    cfg = gpt2.preset(name)
    b = gpt2.build(cfg)
    assert count_fills(b) == gpt2.parameter_count(cfg)
    assert all(op.type in ("GaussianFill", "ConstantFill") for op in b.init.op)   # shapes, no values
    untied = gpt2.build(gpt2.preset(name, tied=False))
    assert count_fills(untied) == gpt2.parameter_count(cfg) + cfg.vocab * cfg.width


def test_the_presets_are_gpt2s_sizes():
    # GPT-2 (tied head): 124M, 355M, 774M, 1.5B; the planning config about 10B
    expected = {"gpt2-small": 124e6, "gpt2-medium": 355e6, "gpt2-large": 774e6, "gpt2-xl": 1558e6,
                "gpt-10b": 10e9}
    for name, n in expected.items():
        assert gpt2.parameter_count(gpt2.preset(name)) == pytest.approx(n, rel=0.01), name


def test_shape_inference_over_gpt2_small():
    cfg = gpt2.preset("gpt2-small")
    b = gpt2.build(cfg)
    typed = infer(net_from_netdef(b.predict, b.init), input_types(b))
    B, S, D, H, V = cfg.batch, cfg.seq, cfg.width, cfg.heads, cfg.vocab
    want = {"tok_emb": (B * S, D), "h0_attn_qkv": (B * S, 3 * D), "h0_q_heads": (B, H, S, D // H),
            "h0_scores": (B, H, S, S), "h0_attn_probs": (B, H, S, S), "h11_ctx": (B * S, D),
            "h11_mlp_fc": (B * S, 4 * D), "h11_res_2": (B * S, D), "ln_f_std": (B * S, 1),
            "logits": (B * S, V), "loss": ()}
    for blob, shape in want.items():
        assert tuple(typed.blobs[blob].shape) == shape, blob
    assert all(t is not None for op in typed.op_outputs for t in op)


# ---------------------------------------------------------------- forward: placer, Caffe2, float64

def _erf(x):
    return np.vectorize(math.erf)(x)


def reference(cfg, w: dict, f: dict) -> tuple[np.ndarray, float]:
    """GPT-2's forward pass in float64: (logits, mean cross-entropy of the labels)."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    B, S, D, H = cfg.batch, cfg.seq, cfg.width, cfg.heads
    Dh = D // H

    def ln(x, tag):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg.epsilon) * w[f"{tag}_g"] + w[f"{tag}_b"]

    def fc(x, tag):
        return x @ w[f"{tag}_w"].T + w[f"{tag}_b"]

    x = w["wte"][f["tokens"]] + w["wpe"][f["positions"]]
    causal = np.tril(np.ones((S, S), bool))
    for i in range(cfg.layers):
        q, k, v = np.split(fc(ln(x, f"h{i}_ln_1"), f"h{i}_attn_qkv"), 3, axis=1)
        q, k, v = (t.reshape(B, S, H, Dh).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(Dh)
        s = np.where(causal, s, s + gpt2.MASK_VALUE)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + fc((p @ v).transpose(0, 2, 1, 3).reshape(B * S, D), f"h{i}_attn_proj")
        m = fc(ln(x, f"h{i}_ln_2"), f"h{i}_mlp_fc")
        m = 0.5 * m * (1.0 + _erf(m / math.sqrt(2.0)))
        x = x + fc(m, f"h{i}_mlp_proj")
    logits = ln(x, "ln_f") @ w["wte"].T
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return logits, float(-logp[np.arange(B * S), f["labels"]].mean())


def chain_length(cfg) -> int:
    """Float32 roundings along the longest path to a logit: the lengths of the sums (dot
    products and LayerNorm reductions) one after another, and a few per elementwise op."""
    D, Dh, S = cfg.width, cfg.head_dim, cfg.seq
    per_block = D + Dh + S + D + D + 4 * D + 2 * D + 16
    return cfg.layers * per_block + 2 * D


def placer_weights(ex: Executor) -> dict:
    """Copies of the state the init net made (a train step updates the state in place)."""
    ex.run_init()
    return {k: np.array(v) for k, v in ex.params.items()}


FORWARD = """
net = text_format.Parse(NET, caffe2_pb2.NetDef())
for k, v in inputs.items():
    workspace.FeedBlob(k, v)
workspace.RunNetOnce(net)
save(logits=workspace.FetchBlob("logits"), loss=workspace.FetchBlob("loss"))
"""


@pytest.mark.caffe2
def test_tiny_forward_matches_caffe2_and_the_float64_reference():
    b = gpt2.build(TINY)
    ex = Executor(net_from_netdef(b.predict, b.init), input_types=input_types(b))
    w = placer_weights(ex)
    f = gpt2.feeds(TINY, seed=3)
    ours = ex.run(f, warmup=0)
    theirs, _ = run_caffe2(f"NET = {json.dumps(text_format.MessageToString(b.predict))}\n" + FORWARD, {**w, **f})
    logits64, loss64 = reference(TINY, w, f)
    # Each float32 result is within (chain of roundings) x u x (size of the values) of the
    # exact one (Higham's bound for sums, LayerNorm keeping relative errors relative);
    # two float32 computations are within twice that of each other.
    tol = chain_length(TINY) * U32 * np.abs(logits64).max()
    for got in (ours["logits"], theirs["logits"]):
        assert got.shape == logits64.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, logits64, rtol=0, atol=tol)
    np.testing.assert_allclose(ours["logits"], theirs["logits"], rtol=0, atol=2 * tol)
    # the loss is a log-softmax (errors in the logits at most doubled) averaged: plus the
    # roundings of a V-long sum
    loss_tol = 2 * tol + TINY.vocab * U32 * loss64
    assert abs(float(ours["loss"]) - loss64) <= loss_tol
    assert abs(float(theirs["loss"]) - loss64) <= loss_tol
    # the mask matters: without it the logits leave the tolerance ...
    no_mask = dict(f, attn_mask=np.zeros_like(f["attn_mask"]))
    assert np.abs(ex.run(no_mask, warmup=0)["logits"] - logits64).max() > 10 * tol
    # ... and with it a position sees no later token: changing the last token of each
    # sequence moves only the last position's logits
    later = dict(f, tokens=f["tokens"].copy())
    last = np.arange(TINY.batch) * TINY.seq + TINY.seq - 1
    later["tokens"][last] = (later["tokens"][last] + 1) % TINY.vocab
    moved = ex.run(later, warmup=0)["logits"].reshape(TINY.batch, TINY.seq, -1)
    before = ours["logits"].reshape(TINY.batch, TINY.seq, -1)
    np.testing.assert_allclose(moved[:, :-1], before[:, :-1], rtol=0, atol=2 * tol)
    assert np.abs(moved[:, -1] - before[:, -1]).max() > 10 * tol


def test_the_causal_mask_is_minus_1e4_above_the_diagonal():
    m = gpt2.causal_mask(4)
    assert m.dtype == np.float32
    for i in range(4):
        for j in range(4):
            assert m[i, j] == (gpt2.MASK_VALUE if j > i else 0.0)


# ---------------------------------------------------------------- train-net

def train_nets(tmp_path, optimizer: str, lr: str):
    b = gpt2.build(TINY)
    paths = b.save(tmp_path, TINY.name)
    out = tmp_path / f"train_{optimizer}"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["train-net", str(paths["predict"]), "--init-net", str(paths["init"]), "--loss", "loss",
                       "--optimizer", optimizer, "--lr", lr, "-o", str(out)])
    assert rc == 0
    return b, load_netdef(out / "train_net.pbtxt"), load_netdef(out / "train_init_net.pbtxt")


def test_the_train_net_trains_with_adam(tmp_path):
    b, train, init = train_nets(tmp_path, "adam", "0.01")
    types = {op.type for op in train.op}
    assert {"LayerNormGradient", "GeluGradient", "SoftmaxGradient", "BatchMatMul", "SparseToDense",
            "Adam", "SparseAdam"} <= types
    ex = Executor(net_from_netdef(train, init), input_types=input_types(b))
    f = gpt2.feeds(TINY, seed=1)
    losses = []
    ex.run(f, iterations=20, warmup=0, watch=["loss"], on_step=lambda s, v: losses.append(float(v["loss"])))
    # from about log(vocab) (uniform predictions at the start) the fixed batch is learnt
    assert losses[0] == pytest.approx(math.log(TINY.vocab), rel=0.05)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.5 * losses[0]


TRAIN = """
train = text_format.Parse(TRAIN_NET, caffe2_pb2.NetDef())
init = text_format.Parse(INIT_NET, caffe2_pb2.NetDef())
workspace.RunNetOnce(init)
for k, v in inputs.items():
    workspace.FeedBlob(k, v)
workspace.CreateNet(train)
losses, after = [], {}
for step in range(STEPS):
    workspace.RunNet(train.name)
    losses.append(float(workspace.FetchBlob("loss")))
    if step == 0:
        after = {p: workspace.FetchBlob(p) for p in PARAMS}
save(**after)
save_json(losses)
"""


@pytest.mark.caffe2
def test_sgd_steps_match_caffe2(tmp_path):
    """The same train net in real Caffe2 from the same weights: the first update of every
    parameter and three steps of losses agree."""
    lr, steps = 0.5, 3
    b, train, init = train_nets(tmp_path, "sgd", str(lr))
    ex = Executor(net_from_netdef(train, init), input_types=input_types(b))
    w = placer_weights(ex)
    params = sorted(n for n in w if n in {o for op in b.init.op for o in op.output})
    start = {p: w[p].copy() for p in params}
    f = gpt2.feeds(TINY, seed=2)
    losses = []
    ex.run(f, iterations=1, warmup=0, watch=["loss"], on_step=lambda s, v: losses.append(float(v["loss"])))
    ours_after = {p: np.asarray(ex.params[p]).copy() for p in params}
    ex.run(f, iterations=steps - 1, warmup=0, watch=["loss"], on_step=lambda s, v: losses.append(float(v["loss"])))
    script = (f"TRAIN_NET = {json.dumps(text_format.MessageToString(train))}\n"
              f"INIT_NET = {json.dumps(text_format.MessageToString(init))}\n"
              f"PARAMS = {params!r}\nSTEPS = {steps}\n" + TRAIN)
    theirs_after, their_losses = run_caffe2(script, {**start, **f})
    # A gradient is a backward chain about twice the forward one; each update is lr x the
    # gradient, so two float32 updates differ by at most 2 x 2 x chain x u x the largest
    # update of the parameter, plus the rounding of p - lr g.
    rel = 4 * chain_length(TINY) * U32
    for p in params:
        mine, ref = ours_after[p] - start[p], theirs_after[p] - start[p]
        assert np.abs(ref).max() > 0, p
        np.testing.assert_allclose(mine, ref, rtol=0, atol=rel * np.abs(ref).max() + 2 * U32 * np.abs(start[p]).max(),
                                   err_msg=p)
    # the losses: each step's forward pass as in the forward test (two float32 results
    # within 2 x the logits' bound, doubled by the log-softmax), on parameters that
    # differ by the updates' roundings, which add as much again per step taken
    logits64, loss64 = reference(TINY, start, f)
    loss_tol = 4 * chain_length(TINY) * U32 * np.abs(logits64).max() + TINY.vocab * U32 * loss64
    for k, (a, c) in enumerate(zip(losses, their_losses)):
        assert abs(a - c) <= (k + 1) * loss_tol, (k, losses, their_losses)
    assert abs(losses[0] - loss64) <= loss_tol
    assert their_losses[-1] < their_losses[0]


@pytest.mark.caffe2
def test_the_adam_train_net_trains_in_caffe2(tmp_path):
    """Real Caffe2 runs the written Adam train net (Adam, SparseAdam on wpe, SparseToDense
    and Sum for the tied wte) from placer's weights: its first loss is placer's forward
    pass, and the loss falls."""
    b, train, init = train_nets(tmp_path, "adam", "0.01")
    ex = Executor(net_from_netdef(train, init), input_types=input_types(b))
    w = placer_weights(ex)
    params = sorted(o for op in b.init.op for o in op.output)
    f = gpt2.feeds(TINY, seed=4)
    ours = []
    ex.run(f, iterations=1, warmup=0, watch=["loss"], on_step=lambda s, v: ours.append(float(v["loss"])))
    script = (f"TRAIN_NET = {json.dumps(text_format.MessageToString(train))}\n"
              f"INIT_NET = {json.dumps(text_format.MessageToString(init))}\n"
              f"PARAMS = {params!r}\nSTEPS = 5\n" + TRAIN)
    _, theirs = run_caffe2(script, {**{p: w[p] for p in params}, **f})
    logits64, loss64 = reference(TINY, w, f)
    loss_tol = 4 * chain_length(TINY) * U32 * np.abs(logits64).max() + TINY.vocab * U32 * loss64
    assert abs(theirs[0] - ours[0]) <= loss_tol
    assert all(b < a for a, b in zip(theirs, theirs[1:])), theirs


# ---------------------------------------------------------------- planning

def plan(*argv) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["plan", *map(str, argv), "--json"])
    assert rc == 0, err.getvalue()
    return strict_json(out.getvalue())


GPU = "v100-16gb-sxm2"


def test_gpt2_small_plans_on_one_gpu(tmp_path):
    cfg = gpt2.preset("gpt2-small")
    paths = gpt2.build(cfg).save(tmp_path, cfg.name)
    doc = plan(paths["predict"], "--init-net", paths["init"], "--gpu-profile", GPU)
    assert len(doc["ops"]) == 3 + 23 * cfg.layers + 3
    assert all(op["device"] == "cuda:0" for op in doc["ops"]), [op for op in doc["ops"] if op["device"] != "cuda:0"]
    params = sum(t["bytes"] for t in doc["tensors"] if t["producer"] == -2)
    assert params == 4 * gpt2.parameter_count(cfg)


def test_gpt2_small_train_net_plans_on_one_gpu(tmp_path):
    cfg = gpt2.preset("gpt2-small")
    paths = gpt2.build(cfg).save(tmp_path, cfg.name)
    out = tmp_path / "train"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["train-net", str(paths["predict"]), "--init-net", str(paths["init"]), "--loss", "loss",
                         "--optimizer", "adam", "--lr", "1e-4", "-o", str(out)]) == 0
    n = cfg.batch * cfg.seq
    doc = plan(out / "train_net.pbtxt", "--init-net", out / "train_init_net.pbtxt", "--gpu-profile", GPU,
               "--input", f"tokens={n}:int32", "--input", f"positions={n}:int32", "--input", f"labels={n}:int32",
               "--input", f"attn_mask={cfg.seq},{cfg.seq}")
    # forward and backward all on the GPU; of the updates, those of the vectors (biases,
    # LayerNorm gains: 768 floats, faster on the CPU than 14 GPU launches) may stay there
    first_update = next(i for i, op in enumerate(doc["ops"]) if op["type"] in ("LearningRate", "AtomicIter"))
    assert first_update > 2 * (3 + 23 * cfg.layers)         # the forward ops and their gradients
    assert all(op["device"] == "cuda:0" for op in doc["ops"][:first_update])
    train = load_netdef(out / "train_net.pbtxt")
    two_d = {p for p in (op.output[0] for op in load_netdef(out / "train_init_net.pbtxt").op)
             if p.endswith("_w") or p in ("wte", "wpe")}
    for i, op in enumerate(train.op[first_update:], first_update):
        if op.type in ("Adam", "SparseAdam") and op.input[0] in two_d:
            assert doc["ops"][i]["device"] == "cuda:0", op.input[0]


def test_the_bundled_tiny_net_is_the_generators():
    net = examples.path("gpt2_tiny")
    assert load_netdef(net) == gpt2.build(TINY).predict
