"""Bundled example nets, generated in code (no net from elsewhere is copied in).

- ``dlrm_criteo_1tb``: the MLPerf Criteo Terabyte DLRM (planning only: ~96 GB of tables);
- ``dlrm_small``: the same structure with small tables (runs on a laptop);
- ``dlrm_40gb``: ten 8M-row tables (about 41 GB): more than one 16 GB GPU holds (planning only);
- ``resnet_small``: a small ResNet-style CNN;
- ``two_tower``: two independent heavy convolution towers joined at the end;
- ``word2vec_train``: a word2vec-style train net (a 10M x 300 embedding table read by
  SparseLengthsSum, a projection, a softmax loss; Adagrad, sparse on the table), made by
  placer's own train-net generator (planning only: 22 GiB with the optimizer state).

``python -m placer.examples [FOLDER]`` regenerates the files shipped in ``examples/data``.
"""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def builders() -> dict:
    from placer.examples import dlrm, resnet, two_tower
    return {
        "dlrm_criteo_1tb": lambda: dlrm.build(dlrm.criteo_1tb()),
        "dlrm_40gb": lambda: dlrm.build(dlrm.tables_40gb()),
        "two_tower": lambda: two_tower.build(),
        "dlrm_small": lambda: dlrm.build(dlrm.small()),
        "resnet_small": lambda: resnet.build(),
    }


def generate(folder: str | Path = DATA) -> dict[str, dict[str, Path]]:
    """Write every bundled net (predict or train net, init, value_info) into ``folder``."""
    from placer.examples import word2vec
    out = {name: make().save(folder, name) for name, make in builders().items()}
    out["word2vec_train"] = word2vec.save_train(folder, "word2vec_train")
    return out


def path(name: str) -> Path:
    """The shipped predict net of a bundled example."""
    p = DATA / f"{name}.pbtxt"
    if not p.exists():
        generate()
    return p
