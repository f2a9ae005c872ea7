"""Where train nets are written: ``train_net`` and ``train_init_net`` (and ``update_net``
when the gradients of several runs are summed before one update), text and optionally binary."""
from __future__ import annotations

import os
from pathlib import Path

from placer.errors import PlacerError
from placer.formats.caffe2 import save_netdef

TRAIN_NET, TRAIN_INIT_NET, UPDATE_NET = "train_net", "train_init_net", "update_net"


def train_net_paths(out_dir: str | os.PathLike, update: bool = False, binary: bool = False) -> list[Path]:
    """The files ``save_train_nets`` writes, in order."""
    names = [TRAIN_NET, TRAIN_INIT_NET] + ([UPDATE_NET] if update else [])
    suffixes = [".pbtxt"] + ([".pb"] if binary else [])
    return [Path(out_dir) / f"{name}{suffix}" for name in names for suffix in suffixes]


def check_output_dir(out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PlacerError(f"{out}: -o takes a folder, and this is a file",
                          hint="give a folder name; it is created when missing")
    return out


def save_train_nets(out_dir: str | os.PathLike, train, init, update=None,
                    binary: bool = False) -> list[Path]:
    """Write the nets atomically (each file whole or not at all); returns the paths."""
    nets = {TRAIN_NET: train, TRAIN_INIT_NET: init, UPDATE_NET: update}
    written = []
    for path in train_net_paths(out_dir, update is not None, binary):
        netdef = nets[path.stem]
        written.append(save_netdef(netdef, path, binary=path.suffix == ".pb"))
    return written
