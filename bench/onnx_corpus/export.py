"""Export the ONNX corpus that placer's ONNX input is tested on: tests/data/onnx/.

Usage (needs torch, torchvision, onnx, onnxscript and onnxruntime; not placer's venv):
    python bench/onnx_corpus/export.py [--out tests/data/onnx] [--only resnet18,bert_tiny]

Every model is built with random weights (torchvision's ``weights=None``, fixed seeds;
nothing is downloaded), put in eval mode and exported at batch 1 (224x224 for the vision
models):
  * TorchScript exporter (``dynamo=False``) at opset 17, every model;
  * TorchScript exporter at opset 9, the torchvision CNNs (Caffe2's ONNX backend knows
    opsets <= 9), where the exporter manages it;
  * the dynamo exporter (``dynamo=True``) at its default opset, for a few models.
Each full export is run by ONNX Runtime on a seeded input and compared with PyTorch's
output (the largest difference goes in the manifest), then written in compact form: every
float initializer of more than STRIP_ELEMENTS elements keeps its name, dims and data_type
but loses its data, and the model's metadata_props entry ``placer.stripped_initializers``
lists those names (a JSON list). ``tests/onnx_corpus.py::materialize`` refills them.
An export that fails is recorded with its error in the manifest's ``failures``.

The published GFLOPS and parameter counts of the torchvision models are read from the
installed torchvision's weights enums (``<Model>_Weights.IMAGENET1K_V1.meta``: ``_ops`` and
``num_params``); the manifest names the source file and line of each.
"""
from __future__ import annotations

import argparse
import inspect
import io
import json
import math
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STRIP_ELEMENTS = 1024
STRIPPED_KEY = "placer.stripped_initializers"
SEED = 0
# (name, constructor kwargs) of the torchvision models; googlenet's aux heads only train.
TORCHVISION = [
    ("resnet18", {}), ("resnet50", {}), ("mobilenet_v2", {}), ("mobilenet_v3_small", {}),
    ("mobilenet_v3_large", {}), ("squeezenet1_0", {}), ("squeezenet1_1", {}), ("densenet121", {}),
    ("vgg16", {}), ("googlenet", {"aux_logits": False, "init_weights": True}),
    ("efficientnet_b0", {}), ("alexnet", {}), ("shufflenet_v2_x1_0", {}),
]
OWN = ["dlrm_small", "bert_tiny", "gpt2_tiny"]
# Models also exported by the dynamo exporter (its default opset).
DYNAMO = ["resnet18", "mobilenet_v3_small", "bert_tiny", "gpt2_tiny"]


# ----------------------------------------------------------------------------- own models

def _own_models():
    """The three models written here, as classes (torch imported only when exporting)."""
    import torch
    from torch import nn

    class DLRMSmall(nn.Module):
        """DLRM-style: a bottom MLP over dense features, EmbeddingBag(sum) tables read with
        offsets, pairwise dot products of all feature vectors, a top MLP and a sigmoid."""

        def __init__(self, dense=13, dim=16, rows=(1000, 500, 2000), bottom=(64, 16), top=(64, 32, 1)):
            super().__init__()
            layers, width = [], dense
            for w in bottom:
                layers += [nn.Linear(width, w), nn.ReLU()]
                width = w
            self.bottom = nn.Sequential(*layers)
            self.tables = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum") for r in rows)
            n = len(rows) + 1
            li, lj = torch.tril_indices(n, n, offset=-1)
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)
            layers, width = [], dim + n * (n - 1) // 2
            for i, w in enumerate(top):
                layers.append(nn.Linear(width, w))
                if i < len(top) - 1:
                    layers.append(nn.ReLU())
                width = w
            self.top = nn.Sequential(*layers)

        def forward(self, dense_x, idx0, off0, idx1, off1, idx2, off2):
            x = self.bottom(dense_x)
            embs = [t(i, o) for t, i, o in zip(self.tables, (idx0, idx1, idx2), (off0, off1, off2))]
            feats = torch.stack([x] + embs, dim=1)                    # [B, n, dim]
            dots = torch.bmm(feats, feats.transpose(1, 2))            # [B, n, n]
            pairs = dots[:, self.li, self.lj]                         # [B, n(n-1)/2]
            return torch.sigmoid(self.top(torch.cat([x, pairs], dim=1)))

    class SelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads, self.head_dim = heads, hidden // heads
            self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            self.out = nn.Linear(hidden, hidden)

        def split(self, t):
            b, s, _ = t.shape
            return t.reshape(b, s, self.heads, self.head_dim).transpose(1, 2)   # [B, H, S, Dh]

        def forward(self, x, additive_mask):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + additive_mask
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
            b, h, s, d = ctx.shape
            return self.out(ctx.transpose(1, 2).reshape(b, s, h * d))

    class EncoderLayer(nn.Module):
        """Post-LayerNorm (BERT): x = LN(x + attn(x)); x = LN(x + FFN(x))."""

        def __init__(self, hidden, heads, ffn):
            super().__init__()
            self.attn = SelfAttention(hidden, heads)
            self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
            self.ffn = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

        def forward(self, x, additive_mask):
            x = self.ln1(x + self.attn(x, additive_mask))
            return self.ln2(x + self.ffn(x))

    class BertTiny(nn.Module):
        def __init__(self, config):
            super().__init__()
            c = config
            self.word = nn.Embedding(c["vocab"], c["hidden"])
            self.position = nn.Embedding(c["max_positions"], c["hidden"])
            self.token_type = nn.Embedding(c["type_vocab"], c["hidden"])
            self.ln = nn.LayerNorm(c["hidden"], eps=1e-12)
            self.layers = nn.ModuleList(EncoderLayer(c["hidden"], c["heads"], c["ffn"]) for _ in range(c["layers"]))
            self.pool = nn.Linear(c["hidden"], c["hidden"])
            self.register_buffer("positions", torch.arange(c["max_positions"]).unsqueeze(0), persistent=False)

        def forward(self, input_ids, token_type_ids, attention_mask):
            s = input_ids.shape[1]
            x = self.word(input_ids) + self.position(self.positions[:, :s]) + self.token_type(token_type_ids)
            x = self.ln(x)
            # BERT's additive mask: 0 where attended, -10000 where masked (finite, so a row
            # with every key masked stays a finite uniform softmax).
            additive = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, additive)
            return x, torch.tanh(self.pool(x[:, 0]))

    class DecoderBlock(nn.Module):
        """Pre-LayerNorm (GPT-2): x += attn(LN(x)); x += MLP(LN(x))."""

        def __init__(self, hidden, heads):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.attn = SelfAttention(hidden, heads)
            self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(approximate="tanh"),
                                     nn.Linear(4 * hidden, hidden))

        def forward(self, x, additive_mask):
            x = x + self.attn(self.ln1(x), additive_mask)
            return x + self.mlp(self.ln2(x))

    class GPT2Tiny(nn.Module):
        def __init__(self, config):
            super().__init__()
            c = config
            self.wte = nn.Embedding(c["vocab"], c["hidden"])
            self.wpe = nn.Embedding(c["max_positions"], c["hidden"])
            self.blocks = nn.ModuleList(DecoderBlock(c["hidden"], c["heads"]) for _ in range(c["layers"]))
            self.ln_f = nn.LayerNorm(c["hidden"])
            self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
            n = c["max_positions"]
            self.register_buffer("causal", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)
            self.register_buffer("positions", torch.arange(n).unsqueeze(0), persistent=False)

        def forward(self, input_ids):
            s = input_ids.shape[1]
            x = self.wte(input_ids) + self.wpe(self.positions[:, :s])
            # Causal mask: key j > query i gets -10000 (the diagonal is always attended).
            allowed = self.causal[:s, :s]
            additive = torch.where(allowed, torch.zeros((), dtype=x.dtype), torch.full((), -10000.0, dtype=x.dtype))
            for block in self.blocks:
                x = block(x, additive)
            return self.lm_head(self.ln_f(x))

    return DLRMSmall, BertTiny, GPT2Tiny


BERT_CONFIG = {"vocab": 1000, "hidden": 64, "heads": 4, "ffn": 256, "layers": 2, "max_positions": 64,
               "type_vocab": 2, "seq": 16}
GPT2_CONFIG = {"vocab": 1000, "hidden": 64, "heads": 4, "layers": 2, "max_positions": 64, "seq": 16}
DLRM_CONFIG = {"dense": 13, "dim": 16, "rows": [1000, 500, 2000], "bag": 4}


def build(name: str):
    """(model in eval mode, inputs spec) for one corpus model, seeded.

    inputs spec: list of {name, shape, dtype, low, high}; integer inputs are drawn from
    [low, high) (indices into a table), float inputs from a standard normal."""
    import torch
    import torchvision

    torch.manual_seed(SEED)
    kwargs = dict(TORCHVISION).get(name)
    if kwargs is not None:
        model = torchvision.models.get_model(name, weights=None, **kwargs)
        spec = [{"name": "input", "shape": [1, 3, 224, 224], "dtype": "float32"}]
        return model.eval(), spec
    DLRMSmall, BertTiny, GPT2Tiny = _own_models()
    if name == "dlrm_small":
        c = DLRM_CONFIG
        model = DLRMSmall(c["dense"], c["dim"], tuple(c["rows"]))
        spec = [{"name": "dense_x", "shape": [1, c["dense"]], "dtype": "float32"}]
        for t, rows in enumerate(c["rows"]):
            # Batch 1: one bag of c["bag"] indices; its offsets are [0].
            spec.append({"name": f"idx{t}", "shape": [c["bag"]], "dtype": "int64", "low": 0, "high": rows})
            spec.append({"name": f"off{t}", "shape": [1], "dtype": "int64", "low": 0, "high": 1})
        return model.eval(), spec
    if name == "bert_tiny":
        c = BERT_CONFIG
        spec = [{"name": "input_ids", "shape": [1, c["seq"]], "dtype": "int64", "low": 0, "high": c["vocab"]},
                {"name": "token_type_ids", "shape": [1, c["seq"]], "dtype": "int64", "low": 0, "high": c["type_vocab"]},
                {"name": "attention_mask", "shape": [1, c["seq"]], "dtype": "int64", "low": 0, "high": 2}]
        return BertTiny(c).eval(), spec
    if name == "gpt2_tiny":
        c = GPT2_CONFIG
        spec = [{"name": "input_ids", "shape": [1, c["seq"]], "dtype": "int64", "low": 0, "high": c["vocab"]}]
        return GPT2Tiny(c).eval(), spec
    raise SystemExit(f"unknown model {name!r}")


OUTPUT_NAMES = {"bert_tiny": ["last_hidden_state", "pooled"], "gpt2_tiny": ["logits"], "dlrm_small": ["click"]}


def seeded_inputs(spec: list[dict], seed: int = SEED) -> dict[str, np.ndarray]:
    """The same rule as tests/onnx_corpus.py::seeded_inputs (normal floats, ints in [low, high))."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in spec:
        if s["dtype"].startswith("int"):
            out[s["name"]] = rng.integers(s["low"], s["high"], size=s["shape"]).astype(s["dtype"])
        else:
            out[s["name"]] = rng.standard_normal(s["shape"]).astype(s["dtype"])
    return out


# ----------------------------------------------------------------------------- published figures

def published(name: str) -> dict:
    """torchvision's documented GFLOPS and parameter count, from the installed source."""
    import torchvision

    enum = torchvision.models.get_model_weights(name)
    weights = enum.IMAGENET1K_V1
    src = Path(inspect.getsourcefile(enum))
    lines, first = inspect.getsourcelines(enum)
    rel = src.relative_to(Path(torchvision.__file__).parent.parent)
    return {"gflops": weights.meta["_ops"], "num_params": weights.meta["num_params"],
            "source": f"torchvision {torchvision.__version__}, {rel}:{first} "
                      f"{enum.__name__}.IMAGENET1K_V1.meta['_ops'], ['num_params']"}


# ----------------------------------------------------------------------------- export and strip

def export(model, spec, outputs, exporter: str, opset: int | None):
    """The full ModelProto of one export (weights inline)."""
    import onnx
    import torch

    args = tuple(torch.from_numpy(a) for a in seeded_inputs(spec).values())
    names = [s["name"] for s in spec]
    if exporter == "torchscript":
        buf = io.BytesIO()
        torch.onnx.export(model, args, buf, dynamo=False, opset_version=opset, input_names=names,
                          output_names=outputs, do_constant_folding=True)
        return onnx.load_from_string(buf.getvalue())
    program = torch.onnx.export(model, args, dynamo=True, input_names=names, output_names=outputs)
    return program.model_proto


def strip(model) -> list[str]:
    """Clear the data of every float initializer with more than STRIP_ELEMENTS elements
    (main graph and subgraphs); record their names in metadata_props. Returns the names."""
    import onnx

    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
              onnx.TensorProto.BFLOAT16}
    names: list[str] = []

    def walk(graph):
        for t in graph.initializer:
            if t.data_type in floats and math.prod(t.dims) > STRIP_ELEMENTS:
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    raise RuntimeError(f"initializer {t.name} has external data; load it first")
                for field in ("raw_data", "float_data", "double_data", "int32_data"):
                    t.ClearField(field)
                names.append(t.name)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        walk(g)

    walk(model.graph)
    if len(set(names)) != len(names):
        raise RuntimeError("two stripped initializers share a name; materialize could not tell them apart")
    for p in list(model.metadata_props):
        if p.key == STRIPPED_KEY:
            model.metadata_props.remove(p)
    model.metadata_props.add(key=STRIPPED_KEY, value=json.dumps(names))
    return names


def ort_check(model_proto, model, spec) -> float:
    """Largest |ONNX Runtime - PyTorch| over all outputs of the full export."""
    import onnxruntime as ort
    import torch

    feeds = seeded_inputs(spec)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model_proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    with torch.no_grad():
        want = model(*(torch.from_numpy(a) for a in feeds.values()))
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    if len(got) != len(want):
        raise RuntimeError(f"ONNX Runtime gave {len(got)} outputs, PyTorch {len(want)}")
    diff = 0.0
    for g, w in zip(got, want):
        w = w.numpy()
        if g.shape != w.shape:
            raise RuntimeError(f"output shape {g.shape} from ONNX Runtime, {w.shape} from PyTorch")
        diff = max(diff, float(np.max(np.abs(g - w))))
    return diff


def value_infos(values) -> list[dict]:
    import onnx

    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]
        out.append({"name": v.name, "shape": dims, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name})
    return out


def plans(only: set[str] | None):
    tv = [n for n, _ in TORCHVISION]
    for name in tv + OWN:
        if only and name not in only:
            continue
        yield name, "torchscript", 17
        if name in tv:
            yield name, "torchscript", 9
        if name in DYNAMO:
            yield name, "dynamo", None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "onnx")
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    a = ap.parse_args()
    import onnx
    import onnxruntime
    import onnxscript
    import torch
    import torchvision

    only = {s for s in a.only.split(",") if s} or None
    a.out.mkdir(parents=True, exist_ok=True)
    manifest_path = a.out / "manifest.json"
    manifest = {"generator": "bench/onnx_corpus/export.py",
                "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                             "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
                             "onnxruntime": onnxruntime.__version__},
                "seed": SEED, "strip_elements": STRIP_ELEMENTS, "stripped_key": STRIPPED_KEY,
                "configs": {"bert_tiny": BERT_CONFIG, "gpt2_tiny": GPT2_CONFIG, "dlrm_small": DLRM_CONFIG},
                "models": [], "failures": []}
    if only and manifest_path.exists():   # a partial run keeps the other entries
        old = json.loads(manifest_path.read_text())
        manifest["models"] = [m for m in old["models"] if m["name"] not in only]
        manifest["failures"] = [f for f in old["failures"] if f["name"] not in only]
    built: dict = {}
    for name, exporter, opset in plans(only):
        if name not in built:
            built.clear()
            built[name] = build(name)
        model, spec = built[name]
        tag = f"opset{opset}" if exporter == "torchscript" else "dynamo"
        print(f"{name} {exporter} {opset or 'default'} ...", flush=True)
        try:
            proto = export(model, spec, OUTPUT_NAMES.get(name, ["output"]), exporter, opset)
            onnx.checker.check_model(proto, full_check=True)
            diff = ort_check(proto, model, spec)
        except Exception as e:   # recorded honestly, the run goes on
            msg = f"{type(e).__name__}: {e}".strip().splitlines()
            first = next((m for m in msg if m.strip()), type(e).__name__)
            manifest["failures"].append({"name": name, "exporter": exporter, "opset": opset,
                                         "error": first[:400]})
            print(f"  FAILED: {first[:400]}", flush=True)
            if "-v" in sys.argv:
                traceback.print_exc()
            continue
        full_bytes = proto.ByteSize()
        stripped = strip(proto)
        path = a.out / f"{name}.{tag}.onnx"
        path.write_bytes(proto.SerializeToString())
        entry = {"name": name, "file": path.name,
                 "source": f"torchvision.models.{name}" if name in dict(TORCHVISION) else "own (bench/onnx_corpus/export.py)",
                 "exporter": exporter, "opset": next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                 "inputs": spec, "outputs": value_infos(proto.graph.output),
                 "measured_params": sum(p.numel() for p in model.parameters()),
                 "stripped_initializers": len(stripped), "file_bytes": path.stat().st_size,
                 "full_bytes": full_bytes, "ort_vs_torch_max_abs_diff": diff,
                 "nodes": len(proto.graph.node)}
        if name in dict(TORCHVISION):
            entry["constructor_kwargs"] = dict(TORCHVISION)[name]
            entry["published"] = published(name)
        manifest["models"].append(entry)
        print(f"  {path.name}: {entry['file_bytes']} bytes (full {full_bytes}), opset {entry['opset']}, "
              f"{len(stripped)} stripped, ORT vs torch {diff:.3g}", flush=True)
    order = [n for n, _ in TORCHVISION] + OWN
    manifest["models"].sort(key=lambda m: (order.index(m["name"]), m["file"]))
    manifest["failures"].sort(key=lambda f: (order.index(f["name"]), f["exporter"], f["opset"] or 0))
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(manifest['models'])} files, {len(manifest['failures'])} failures -> {manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
