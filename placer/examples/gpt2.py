"""A GPT-2-style decoder-only transformer built in code (Radford et al. 2019).

The net, op by op (``B`` batch, ``S`` sequence, ``D`` width, ``H`` heads, ``Dh = D / H``):

- ``tokens`` and ``positions`` (int32, ``(B * S,)``: the batch's sequences one after the
  other) -> ``Gather`` on ``wte`` (``(V, D)``) and on ``wpe`` (``(S, D)``) -> ``Add``: the
  residual stream, ``(B * S, D)``, one row per token (flat, because Caffe2's
  ``SparseToDense``, the gradient of a dense-gradient ``Gather``, takes 1-D indices only);
- ``layers`` blocks of: ``LayerNorm`` (``elementwise_affine``) -> one ``FC`` to
  ``(B * S, 3D)`` -> ``Split`` into q, k, v -> per tensor ``Reshape`` to
  ``(B, S, H, Dh)`` and ``Transpose`` (0, 2, 1, 3) to ``(B, H, S, Dh)`` -> ``BatchMatMul``
  (q, k, ``trans_b``) -> ``Scale`` by 1/sqrt(Dh) -> ``Add`` of the causal mask
  (``broadcast`` 1) -> ``Softmax`` (``axis`` 3, the last) -> ``BatchMatMul`` with v ->
  ``Transpose`` back and ``Reshape`` to ``(B * S, D)`` -> projection ``FC`` -> residual
  ``Add``; ``LayerNorm`` -> ``FC`` to 4D -> ``Gelu`` (the exact erf form) -> ``FC`` back
  to D -> residual ``Add``;
- a final ``LayerNorm``, the logits ``BatchMatMul(h, wte, trans_b=1)`` -> ``(B * S, V)``, and ``SoftmaxWithLoss`` against ``labels`` (int32,
  ``(B * S,)``: the next token of each position) -> ``loss``.

The language-model head is tied to the token embedding, as GPT-2's is: ``wte`` is read
by the ``Gather`` and by the logits ``BatchMatMul`` (``tied=False`` gives the head its
own ``lm_head_w``). The tied table gets a dense gradient from both readers, so its
``Gather`` has ``dense_gradient`` 1: Caffe2's backward pass does not aggregate a mix of a
sparse gradient (GradientSlice) and a dense one (caffe2/python/core.py). GPT-2 has no bias in the head, hence a (2-D) ``BatchMatMul`` rather than ``FC``;
not ``MatMul``, whose gradient ops carry a third (shape) input that placer's ``MatMul``
does not take.

The causal mask is an input, ``attn_mask`` (``(S, S)`` float32: 0 on and below the
diagonal, -1e4 above it; ``causal_mask(S)`` makes it): placer has no kernels for the
Caffe2 ops that could build it inside the net (``RangeFill``, the comparisons), and a
``GivenTensorFill`` of it would hold S^2 values. Dropout is left out (it is the identity at inference and in planning).

Parameters are fill ops with shapes only (``GaussianFill``, ``ConstantFill``), so a
10B-parameter net is a few hundred kB of text and plans without allocating its weights.
Initialisation follows GPT-2: weights N(0, 0.02), ``wpe`` N(0, 0.01), the two residual
projections of each block N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorm gain 1.

Presets (``PRESETS``): ``gpt2-small`` (12 layers, 768 wide, 12 heads: 124,439,808
parameters), ``gpt2-medium`` (24, 1024, 16), ``gpt2-large`` (36, 1280, 20), ``gpt2-xl``
(48, 1600, 25), all with 1024 positions and a 50257-token vocabulary; ``gpt-10b``, width
4096 with 49 layers and 32 heads: 10.08 billion parameters (the layer count that comes
closest to 10B at that width), the size of the 10B model ZeRO-Offload (Ren et al. 2021)
trains on one GPU, for planning only;
``gpt2-tiny`` (2 layers, 32 wide, 2 heads, 8 positions, 50 tokens) runs anywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from placer.examples.builder import NetBuilder

MASK_VALUE = -1e4     # the additive mask above the diagonal (GPT-2's own masked_bias)
INIT_STD = 0.02
WPE_STD = 0.01


@dataclass(frozen=True)
class GPT2Config:
    name: str
    layers: int
    width: int
    heads: int
    seq: int = 1024
    vocab: int = 50257
    batch: int = 1
    epsilon: float = 1e-5
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


PRESETS = {
    "gpt2-tiny": GPT2Config("gpt2_tiny", layers=2, width=32, heads=2, seq=8, vocab=50, batch=2),
    "gpt2-small": GPT2Config("gpt2_small", layers=12, width=768, heads=12),
    "gpt2-medium": GPT2Config("gpt2_medium", layers=24, width=1024, heads=16),
    "gpt2-large": GPT2Config("gpt2_large", layers=36, width=1280, heads=20),
    "gpt2-xl": GPT2Config("gpt2_xl", layers=48, width=1600, heads=25),
    "gpt-10b": GPT2Config("gpt_10b", layers=49, width=4096, heads=32),
}


def preset(name: str, **changes) -> GPT2Config:
    """A preset by name (``PRESETS``), with fields changed (``batch=8``, ...)."""
    if name not in PRESETS:
        raise ValueError(f"unknown GPT-2 preset {name!r}: one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **changes)


def parameter_count(cfg: GPT2Config) -> int:
    """The closed form: embeddings, 12 D^2 + 13 D per block, the final LayerNorm (and the
    untied head's V x D)."""
    d = cfg.width
    count = cfg.vocab * d + cfg.seq * d + cfg.layers * (12 * d * d + 13 * d) + 2 * d
    return count if cfg.tied else count + cfg.vocab * d


def causal_mask(seq: int) -> np.ndarray:
    """The ``attn_mask`` input: 0 where position i may attend to j (j <= i), -1e4 above."""
    return np.triu(np.full((seq, seq), MASK_VALUE, np.float32), k=1)


def build(cfg: GPT2Config) -> NetBuilder:
    if cfg.width % cfg.heads:
        raise ValueError(f"{cfg.name}: width {cfg.width} is not a multiple of {cfg.heads} heads")
    b = NetBuilder(cfg.name)
    b.predict.type = "simple"
    B, S, D, H, Dh = cfg.batch, cfg.seq, cfg.width, cfg.heads, cfg.head_dim
    proj_std = INIT_STD / math.sqrt(2 * cfg.layers)

    wte = b.param("wte", (cfg.vocab, D), "GaussianFill", mean=0.0, std=INIT_STD)
    wpe = b.param("wpe", (S, D), "GaussianFill", mean=0.0, std=WPE_STD)
    tokens = b.input("tokens", (B * S,), "int32")
    positions = b.input("positions", (B * S,), "int32")
    mask = b.input("attn_mask", (S, S))
    tok = b.op("Gather", [wte, tokens], "tok_emb", dense_gradient=1 if cfg.tied else 0)
    pos = b.op("Gather", [wpe, positions], "pos_emb")
    x = b.op("Add", [tok, pos], "h0_in")

    def fc(tag: str, x: str, n_in: int, n_out: int, std: float) -> str:
        w = b.param(f"{tag}_w", (n_out, n_in), "GaussianFill", mean=0.0, std=std)
        bias = b.param(f"{tag}_b", (n_out,), "ConstantFill", value=0.0)
        return b.op("FC", [x, w, bias], tag)

    def layer_norm(tag: str, x: str) -> str:
        g = b.param(f"{tag}_g", (D,), "ConstantFill", value=1.0)
        beta = b.param(f"{tag}_b", (D,), "ConstantFill", value=0.0)
        return b.op("LayerNorm", [x, g, beta], [tag, f"{tag}_mean", f"{tag}_std"], axis=1,
                    epsilon=cfg.epsilon, elementwise_affine=1)

    for i in range(cfg.layers):
        p = f"h{i}"
        a = layer_norm(f"{p}_ln_1", x)
        qkv = fc(f"{p}_attn_qkv", a, D, 3 * D, INIT_STD)
        qkv_split = [f"{p}_q", f"{p}_k", f"{p}_v"]
        b.op("Split", [qkv], qkv_split, axis=1)
        heads = []
        for t in qkv_split:
            t4 = b.op("Reshape", [t], [f"{t}_4d", f"{t}_shape"], shape=[-1, S, H, Dh])
            heads.append(b.op("Transpose", [t4], f"{t}_heads", axes=[0, 2, 1, 3]))
        qh, kh, vh = heads
        scores = b.op("BatchMatMul", [qh, kh], f"{p}_scores", trans_b=1)
        scaled = b.op("Scale", [scores], f"{p}_scores_scaled", scale=1.0 / math.sqrt(Dh))
        masked = b.op("Add", [scaled, mask], f"{p}_scores_masked", broadcast=1)
        probs = b.op("Softmax", [masked], f"{p}_attn_probs", axis=3)
        ctx = b.op("BatchMatMul", [probs, vh], f"{p}_ctx_heads")
        ctx = b.op("Transpose", [ctx], f"{p}_ctx_t", axes=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx], [f"{p}_ctx", f"{p}_ctx_shape"], shape=[-1, D])
        attn = fc(f"{p}_attn_proj", ctx, D, D, proj_std)
        x = b.op("Add", [x, attn], f"{p}_res_1")
        m = layer_norm(f"{p}_ln_2", x)
        m = fc(f"{p}_mlp_fc", m, D, 4 * D, INIT_STD)
        m = b.op("Gelu", [m], f"{p}_mlp_gelu")
        m = fc(f"{p}_mlp_proj", m, 4 * D, D, proj_std)
        x = b.op("Add", [x, m], f"{p}_res_2")

    flat = layer_norm("ln_f", x)
    head = wte if cfg.tied else b.param("lm_head_w", (cfg.vocab, D), "GaussianFill", mean=0.0, std=INIT_STD)
    logits = b.op("BatchMatMul", [flat, head], "logits", trans_b=1)
    labels = b.input("labels", (B * S,), "int32")
    b.op("SoftmaxWithLoss", [logits, labels], ["probs", "loss"])
    b.output("logits")
    b.output("loss")
    return b


def feeds(cfg: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch for the net: random tokens, their positions, the causal mask, and as labels
    each token's successor (the last position predicts a random token)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.seq + 1)).astype(np.int32)
    positions = np.tile(np.arange(cfg.seq, dtype=np.int32), cfg.batch)
    return {"tokens": tokens[:, :-1].reshape(-1).copy(), "positions": positions,
            "attn_mask": causal_mask(cfg.seq), "labels": tokens[:, 1:].reshape(-1).copy()}


def write(name: str, folder) -> dict:
    """Write a preset's predict net, init net and value_info into ``folder``."""
    cfg = preset(name)
    return build(cfg).save(folder, cfg.name)


__all__ = ["GPT2Config", "PRESETS", "preset", "parameter_count", "causal_mask", "build", "feeds", "write"]
