"""``sharding.json``, what ``placer shard -o`` writes beside the sharded train net: its name
and the notes ``placer run`` prints from it. A module of its own, so that ``placer run``
does not import the sharding planner."""
from __future__ import annotations

import json
from pathlib import Path

from placer.fileio import note_read

SHARDING_MANIFEST = "sharding.json"


def sharding_notes(net_path) -> list[str]:
    """The notes of the ``sharding.json`` beside a train net ``placer shard -o`` wrote."""
    manifest = Path(net_path).parent / SHARDING_MANIFEST
    if Path(net_path).name not in ("train_net.pbtxt", "train_net.pb") or not manifest.is_file():
        return []
    note_read(manifest)
    try:
        notes = json.loads(manifest.read_text()).get("notes", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [str(n) for n in notes] if isinstance(notes, list) else []
