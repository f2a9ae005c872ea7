"""The directory ``placer plan --cluster C -o OUTDIR`` writes, and its manifest.

    OUTDIR/manifest.json                  what runs where (below)
    OUTDIR/plan.json                      the plan document (docs/PLAN_JSON.md)
    OUTDIR/placed.pbtxt                   the placed net: device_option.node_name = host
    OUTDIR/placed_init.pbtxt
    OUTDIR/one_process.pbtxt              the same placed net for one process (GPUs numbered
    OUTDIR/one_process_init.pbtxt         across the cluster): `placer run` checks it anywhere
    OUTDIR/one_process.value_info.json    its input shapes (placer run finds both beside it)
    OUTDIR/workers/HOST.pbtxt             one Caffe2 net and init net per worker (rewrite_workers)
    OUTDIR/workers/HOST_init.pbtxt

manifest.json (``schema`` "placer.cluster_manifest", version 1): the cluster and its
network; ``world`` (size, the common world blob, engine); per worker its rank, host,
devices, GPU count, net, init net, the inputs the driver feeds it and the outputs it
returns, and the plan's predicted seconds on its devices; every message (tag, phase, blob,
source and destination device, bytes); the predicted step (serial and overlapped).

The manifest's ``placer_output`` ("cluster-plan") and ``files`` mark the folder as placer's.
The directory is written whole into a sibling temporary directory and renamed into place
(``placer.fileio.OutputDir``), so a failed plan leaves no half-written directory; an existing
directory is replaced only when it is empty or holds exactly a previous cluster plan.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from placer.documents import check_model, read_document
from placer.documents.manifest import MANIFEST_SCHEMA, MANIFEST_VERSION, Manifest
from placer.errors import PlacerError
from placer.fileio import OutputDir, atomic_write_text
from placer.formats.caffe2 import net_from_netdef, save_netdef
from placer.rewrite.netdef import place
from placer.rewrite.workers import ENGINE, WORLD, one_process, split_workers
from placer.shapes import infer
from placer.types import DTYPE_TO_DATA_TYPE

MANIFEST = "manifest.json"
OUTPUT_KIND = "cluster-plan"   # the manifest's placer_output field


def write_plan_dir(outdir: str | os.PathLike, result, doc: dict, outputs_on_host: bool = True) -> list[tuple[str, str]]:
    """Write OUTDIR for a cluster plan (``placer.planning.cluster_plan.plan_cluster``'s result, its plan JSON)."""
    cluster, net = result.machine, result.typed.net
    placed = place(net, result.plan.placement, cluster, outputs_on_host=outputs_on_host)
    inputs = list(net.data_inputs)
    types = placed_types(placed.predict, placed.init, result.typed.blobs, inputs)
    predicted = {"serial_s": result.plan.cost.total_s, "makespan_s": result.makespan.get("makespan_s"),
                 "by_device_s": _predicted_by_device(result)}
    return write_placed_dir(outdir, placed.predict, placed.init, cluster, types, inputs, predicted, doc,
                            net.name or Path(net.path).stem)


def write_placed_dir(outdir: str | os.PathLike, predict, init, cluster, types: dict, inputs: list[str],
                     predicted: dict | None = None, doc: dict | None = None, name: str = "") -> list[tuple[str, str]]:
    """Write OUTDIR for a placed cluster net (``device_option.node_name`` on every op):
    the per-worker split, the one-process net, the manifest (module docstring)."""
    folder = OutputDir(outdir, "-o", OUTPUT_KIND, MANIFEST)
    split = split_workers(predict, init, cluster, types, inputs)
    predicted = predicted or {"serial_s": None, "makespan_s": None, "by_device_s": {}}
    per_device = predicted.pop("by_device_s", {}) or {}
    manifest = {
        "schema": MANIFEST_SCHEMA, "schema_version": MANIFEST_VERSION, "net": name or predict.name,
        "cluster": {"name": cluster.name, "description": cluster.describe(), "hosts": list(cluster.hosts),
                    "network": vars(cluster.network)},
        "world": {"size": len(split.workers), "blob": WORLD, "engine": ENGINE},
        "inputs": {b: {"shape": list(types[b].shape), "dtype": types[b].dtype} for b in inputs if b in types},
        "outputs": list(predict.external_output),
        "placed_net": "placed.pbtxt", "placed_init_net": "placed_init.pbtxt" if init is not None else None,
        "one_process_net": "one_process.pbtxt",
        "one_process_init_net": "one_process_init.pbtxt" if init is not None else None,
        "one_process_gpus": len(cluster.gpus),
        "predicted": predicted,
        "workers": [{"rank": w.rank, "host": w.host, "devices": list(w.devices), "gpus": w.gpus,
                     "net": f"workers/{w.host}.pbtxt", "init_net": f"workers/{w.host}_init.pbtxt",
                     "inputs": w.inputs, "outputs": w.outputs,
                     "predicted_s": sum(per_device.get(d, 0.0) for d in w.devices)} for w in split.workers],
        "messages": [vars(m) for m in split.messages],
        "collectives": split.collectives,
    }
    with folder:
        save_netdef(predict, folder.path("placed.pbtxt"))
        save_netdef(one_process(predict, cluster), folder.path("one_process.pbtxt"))
        if init is not None:
            save_netdef(init, folder.path("placed_init.pbtxt"))
            save_netdef(one_process(init, cluster), folder.path("one_process_init.pbtxt"))
        atomic_write_text(folder.path("one_process.value_info.json"),
                          json.dumps(_value_info(types, inputs), indent=1) + "\n")
        for w in split.workers:
            save_netdef(w.predict, folder.path(f"workers/{w.host}.pbtxt"))
            save_netdef(w.init, folder.path(f"workers/{w.host}_init.pbtxt"))
        if doc is not None:
            atomic_write_text(folder.path("plan.json"), json.dumps(doc, indent=1) + "\n")
        folder.write_manifest(manifest)
    return [("cluster plan directory", f"{outdir} ({len(split.workers)} workers, {len(split.messages)} messages)")]


def placed_types(predict, init, known: dict, inputs: list[str]) -> dict:
    """The type of every blob of the placed nets: shape inference over the placed predict
    net (``known``: the unplaced net's types), and a copy the init net makes typed like
    what it copies."""
    pnet = net_from_netdef(predict, init)
    types = {**pnet.params, **{b: t for b, t in known.items() if t is not None}}
    if init is not None:
        for op in init.op:
            if op.type in ("Copy", "CopyCPUToGPU", "CopyGPUToCPU") and op.input[0] in types:
                types[op.output[0]] = types[op.input[0]]
                pnet.params.setdefault(op.output[0], types[op.input[0]])
    found = infer(pnet, {b: known[b] for b in inputs if known.get(b) is not None})
    types.update({b: t for b, t in found.blobs.items() if t is not None})
    return types


def _value_info(types: dict, inputs: list[str]) -> dict:
    return {b: [DTYPE_TO_DATA_TYPE.get(types[b].dtype, 1), list(types[b].shape)] for b in inputs if b in types}


def _predicted_by_device(result) -> dict[str, float]:
    """Predicted op seconds per device name under the chosen plan."""
    arr, dev = result.arrays, result.plan.placement
    out: dict[str, float] = {}
    for i, d in enumerate(dev.tolist()):
        name = arr.devices[d]
        out[name] = out.get(name, 0.0) + float(arr.op_s[i, d])
    return out


MANIFEST_HINT = "write it again with: placer plan NET --cluster NAME -o OUTDIR"


def read_manifest(outdir: str | os.PathLike) -> dict:
    """The manifest of a cluster plan directory, checked (``documents.manifest.Manifest``,
    then that every worker's files are in OUTDIR), as the dict the driver reads."""
    path = Path(outdir) / MANIFEST
    if not path.exists():
        raise PlacerError(f"{outdir}: no cluster plan here ({path} is missing)",
                          hint="write one with: placer plan NET --cluster NAME -o OUTDIR")
    data = read_document(path, "cluster manifest", PlacerError, MANIFEST_HINT)
    if (not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA
            or data.get("schema_version") != MANIFEST_VERSION):
        raise PlacerError(f"{path}: not a placer cluster manifest of version {MANIFEST_VERSION}",
                          hint="write it again with placer plan --cluster")
    manifest = check_model(data, Manifest, str(path), PlacerError, MANIFEST_HINT)
    for j, w in enumerate(manifest.workers):
        for key, file in (("net", w.net), ("init_net", w.init_net)):
            name = Path(file)
            if name.is_absolute() or ".." in name.parts:
                raise PlacerError(f"{path}: field 'workers[{j}].{key}': {file} is not a file inside {outdir}",
                                  hint=MANIFEST_HINT)
            if not (Path(outdir) / name).is_file():
                raise PlacerError(f"{path}: worker {w.host}'s {key.replace('_', ' ')} {file} is missing")
    return data


__all__ = ["write_plan_dir", "write_placed_dir", "read_manifest", "placed_types", "MANIFEST"]
