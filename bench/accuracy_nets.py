"""The nets bench/cost_accuracy.py fits on and predicts, loaded at a batch size.

Caffe prototxts come from the corpus (../shared/nets/caffe); ResNet-101 is written from
the ResNet-50 deploy prototxt (KaimingHe/deep-residual-networks): ResNet-101 is the
same net with 23 bottleneck blocks in stage 4 instead of 6 (He et al. 2016, table 1),
named ``res4b1`` .. ``res4b22`` as that repository's ResNet-101 prototxt names them.
The DLRM is the bundled generator's small configuration at the given batch.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NETS = ROOT.parent / "shared" / "nets"
RESNET101_STAGE4_BLOCKS = 23


def caffe_net(file: str | Path, batch: int, phase: str = "test"):
    """A Caffe prototxt at ``batch`` (the data inputs' first dimension replaced)."""
    from placer.formats import load_net
    from placer.shapes import infer
    from placer.types import TensorType
    path = Path(file) if Path(file).is_absolute() else NETS / "caffe" / file
    net = load_net(path, phase=phase)
    shapes = {b: TensorType((batch,) + t.shape[1:], t.dtype)
              for b, t in net.input_shapes.items() if b in net.data_inputs and t.ndim >= 1}
    net = load_net(path, phase=phase, input_shapes=shapes)
    return infer(net, shapes)


def resnet101_prototxt() -> str:
    """ResNet-101 deploy prototxt text from the ResNet-50 one (module docstring).

    The stage-4 blocks of ResNet-50 are ``res4b`` .. ``res4f`` (after ``res4a``, the
    projection block); each is the same ten layers. The ``res4b`` block is written 22
    times as ``res4b1`` .. ``res4b22``, each reading the previous block's output, the
    ``res4c`` .. ``res4f`` blocks are dropped, and ``res5a`` reads ``res4b22``.
    """
    text = (NETS / "caffe" / "resnet50_ResNet-50-deploy.prototxt").read_text()
    layers = re.split(r"(?m)^(?=layer\s*\{)", text)
    head, layers = layers[0], layers[1:]

    def block_of(layer: str) -> str | None:
        m = re.search(r'name:\s*"(?:res|bn|scale)4([b-f])[_"]', layer)
        return m.group(1) if m else None

    template = [layer for layer in layers if block_of(layer) == "b"]
    first = next(i for i, layer in enumerate(layers) if block_of(layer) == "b")
    kept = [layer for layer in layers if block_of(layer) is None]
    blocks = []
    for i in range(1, RESNET101_STAGE4_BLOCKS):
        previous = "res4a" if i == 1 else f"res4b{i - 1}"
        for layer in template:
            layer = layer.replace('"res4a"', f'"{previous}"')
            blocks.append(re.sub(r'"(res|bn|scale)4b(?=[_"])', rf'"\g<1>4b{i}', layer))
    out = kept[:first] + blocks + kept[first:]
    body = "".join(out).replace('bottom: "res4f"', f'bottom: "res4b{RESNET101_STAGE4_BLOCKS - 1}"')
    return head.replace('name: "ResNet-50"', 'name: "ResNet-101"') + body


def resnet101(batch: int):
    folder = Path(tempfile.mkdtemp(prefix="placer-bench-"))
    path = folder / "resnet101_deploy.prototxt"
    path.write_text(resnet101_prototxt())
    return caffe_net(path, batch)


def dlrm_net(batch: int):
    """The bundled DLRM generator's small configuration (tables up to 20k rows) at ``batch``."""
    from placer.examples import dlrm
    from placer.formats import load_net
    from placer.shapes import infer
    from placer.types import DATA_TYPE_TO_DTYPE, TensorType
    folder = Path(tempfile.mkdtemp(prefix="placer-bench-"))
    paths = dlrm.build(dlrm.small(max_rows=20000, batch=batch)).save(folder, "dlrm")
    info = json.loads(paths["value_info"].read_text())
    shapes = {b: TensorType(tuple(shape), DATA_TYPE_TO_DTYPE[dt]) for b, (dt, shape) in info.items()}
    return infer(load_net(paths["predict"], paths["init"]), shapes)


LOADERS = {
    "alexnet": lambda b: caffe_net("bvlc_alexnet_deploy.prototxt", b),
    "resnet50": lambda b: caffe_net("resnet50_ResNet-50-deploy.prototxt", b),
    "dlrm": dlrm_net,
    "googlenet": lambda b: caffe_net("bvlc_googlenet_train_val.prototxt", b),
    "mobilenet": lambda b: caffe_net("mobilenet_deploy.prototxt", b),
    "resnet101": resnet101,
    "squeezenet": lambda b: caffe_net("squeezenet_v1.0_deploy.prototxt", b),
    "caffenet": lambda b: caffe_net("caffenet_deploy.prototxt", b),
}
