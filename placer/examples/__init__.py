"""Bundled example nets, generated in code (no net from elsewhere is copied in).

- ``dlrm_criteo_1tb``: the MLPerf Criteo Terabyte DLRM (planning only: ~96 GB of tables);
- ``dlrm_small``: the same structure with small tables (runs on a laptop);
- ``dlrm_40gb``: ten 8M-row tables (about 41 GB): more than one 16 GB GPU holds (planning only);
- ``resnet_small``: a small ResNet-style CNN;
- ``two_tower``: two independent heavy convolution towers joined at the end.

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
    """Write every bundled net (predict, init, value_info) into ``folder``."""
    return {name: make().save(folder, name) for name, make in builders().items()}


def path(name: str) -> Path:
    """The shipped predict net of a bundled example."""
    p = DATA / f"{name}.pbtxt"
    if not p.exists():
        generate()
    return p
