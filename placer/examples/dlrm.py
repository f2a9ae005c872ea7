"""A DLRM-shaped recommendation net, built as facebookresearch/dlrm's Caffe2 builder builds it.

Structure (DLRM_FACTS.md): per sparse feature one ``SparseLengthsSum`` over an embedding
table; a bottom MLP (FC + Relu) over the dense features; the "dot" interaction
(``Concat(add_axis=1)`` -> ``BatchMatMul(trans_b=1)`` -> ``Flatten`` -> ``BatchGather`` of the
strictly lower triangle -> ``Concat`` with the dense output); a top MLP ending in a Sigmoid.
Blob names follow the builder's tags (``bot:::fc0_w``, ``emb:::sls3_w``, ...).

``tables_40gb()`` (ten 8M-row tables, about 41 GB) is the net that needs several GPUs.
``criteo_1tb()`` is the MLPerf Criteo Terabyte configuration (26 tables, dimension 128,
bottom 13-512-256-128, top 479-1024-1024-512-256-1, batch 2048): about 96 GB of float32
tables, for planning only. ``small()`` is the same structure with tables capped at a
size that runs on a laptop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from placer.examples.builder import NetBuilder, make_op

# MLPerf DLRM Criteo Terabyte embedding cardinalities (max index range 40M), DLRM_FACTS.md.
CRITEO_1TB_ROWS = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)


@dataclass(frozen=True)
class DlrmConfig:
    name: str
    table_rows: tuple[int, ...]
    dim: int = 128
    bottom: tuple[int, ...] = (13, 512, 256, 128)
    top: tuple[int, ...] = (1024, 1024, 512, 256, 1)  # after the interaction width
    batch: int = 2048
    lookups_per_sample: int = 1
    seed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def num_features(self) -> int:
        return len(self.table_rows) + 1

    @property
    def interaction_width(self) -> int:
        n = self.num_features
        return n * (n - 1) // 2 + self.bottom[-1]


def criteo_1tb() -> DlrmConfig:
    return DlrmConfig("dlrm_criteo_1tb", CRITEO_1TB_ROWS)


def tables_40gb() -> DlrmConfig:
    """An embedding-heavy DLRM of about 41 GB: ten 8M-row tables of dimension 128 (4.1 GB
    each) with the terabyte MLPs; more than one 16 GB GPU holds, less than four do."""
    return DlrmConfig("dlrm_40gb", (8_000_000,) * 10)


def small(max_rows: int = 20000, batch: int = 256) -> DlrmConfig:
    """The same net with every table capped at ``max_rows`` rows (about 100 MB in all)."""
    return DlrmConfig("dlrm_small", tuple(min(r, max_rows) for r in CRITEO_1TB_ROWS), batch=batch)


def build(cfg: DlrmConfig) -> NetBuilder:
    if cfg.bottom[-1] != cfg.dim:
        raise ValueError(f"bottom MLP must end at the embedding dimension {cfg.dim}, not {cfg.bottom[-1]}")
    b = NetBuilder(cfg.name)
    b.predict.type = "simple"
    B = cfg.batch

    # Bottom MLP over the dense features.
    x = b.input("dense_in", (B, cfg.bottom[0]))
    x = _mlp(b, "bot", x, cfg.bottom, sigmoid_last=False)

    # One embedding bag per sparse feature.
    emb_outs = []
    for t, rows in enumerate(cfg.table_rows):
        bound = math.sqrt(1.0 / rows)
        w = b.param(f"emb:::sls{t}_w", (rows, cfg.dim), "UniformFill", min=-bound, max=bound)
        idx = b.input(f"emb:::sls{t}_i", (B * cfg.lookups_per_sample,), "int64")
        lens = b.input(f"emb:::sls{t}_l", (B,), "int32")
        emb_outs.append(b.op("SparseLengthsSum", [w, idx, lens], f"emb:::sls{t}_z"))

    # Dot interaction: pairwise dots of all feature vectors, strictly lower triangle.
    n = cfg.num_features
    T = b.op("Concat", [x] + emb_outs, ["interaction:::T", "interaction:::T_info"], axis=1, add_axis=1)
    Z = b.op("BatchMatMul", [T, T], "interaction:::Z", trans_b=1)
    Zflat = b.op("Flatten", [Z], "interaction:::Zflat", axis=1)
    tril = [j + i * n for i in range(n) for j in range(i)]
    b.init.op.append(_int_fill("interaction:::tril_indices", tril))
    b.init.external_output.append("interaction:::tril_indices")
    b.predict.external_input.append("interaction:::tril_indices")
    Zg = b.op("BatchGather", [Zflat, "interaction:::tril_indices"], "interaction:::Zflat_g")
    R = b.op("Concat", [x, Zg], ["interaction:::R", "interaction:::R_info"], axis=1)

    # Top MLP ending in a Sigmoid: the click probability.
    y = _mlp(b, "top", R, (cfg.interaction_width,) + tuple(cfg.top), sigmoid_last=True, out="prob_click")
    b.output(y)
    return b


def _mlp(b: NetBuilder, tag: str, x: str, sizes, sigmoid_last: bool, out: str | None = None) -> str:
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = b.param(f"{tag}:::fc{i}_w", (n, m), "GaussianFill", mean=0.0, std=math.sqrt(2.0 / (m + n)))
        bias = b.param(f"{tag}:::fc{i}_b", (n,), "GaussianFill", mean=0.0, std=math.sqrt(1.0 / n))
        z = b.op("FC", [x, w, bias], f"{tag}:::fc{i}_z")
        last = i == len(sizes) - 2
        if last and sigmoid_last:
            x = b.op("Sigmoid", [z], out or f"{tag}:::fc{i}_y")
        else:
            x = b.op("Relu", [z], f"{tag}:::fc{i}_y")
    return x


def _int_fill(name: str, values: list[int]):
    return make_op("GivenTensorIntFill", [], [name], shape=[len(values)], values=values)
