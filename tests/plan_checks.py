"""A plan document (docs/PLAN_JSON.md, version 2) checked from its own fields alone.

``recompute`` prices a plan on the host + one GPU the way a user would by hand from the
JSON: every op's time on its device, plus every tensor copied once to each device that
reads it other than where it starts (its producer's device, the host for a host-fed one;
the host also reads external outputs when ``outputs_on_host``), parameters never. Nothing
here calls placer's partition code.
"""
from __future__ import annotations

import json

import pytest


def strict_json(text: str) -> dict:
    """JSON as any parser reads it: NaN and Infinity are not JSON."""
    def refuse(name):
        raise AssertionError(f"{name} in the plan JSON")
    return json.loads(text, parse_constant=refuse)


def recompute(doc: dict, outputs_on_host: bool | None = None) -> dict:
    """{total_s, compute_s, copy_s, pcie_bytes {h2d, d2h}, copies {(tensor, src, dst)}}
    of a plan on a machine with at most one GPU (a tensor's copy times are given for the
    host <-> first GPU link only: ``h2d_s``, ``d2h_s``)."""
    if outputs_on_host is None:
        outputs_on_host = doc.get("outputs_on_host", True)
    kinds = {d["name"]: d["kind"] for d in doc["machine"]["devices"]}
    assert sum(k == "gpu" for k in kinds.values()) <= 1, "recompute prices the host + one GPU"
    host = doc["devices"][0]
    dev = {o["index"]: o["device"] for o in doc["ops"]}
    compute = sum(o["time_s"][o["device"]] for o in doc["ops"])
    copy_s, nbytes, copies = 0.0, {"h2d": 0.0, "d2h": 0.0}, set()
    for t in doc["tensors"]:
        p = t["producer"]
        if p == -2:
            continue
        where = host if p == -1 else dev[p]
        readers = {dev[c] for c in t["consumers"] if c != p}
        if t["external_output"] and outputs_on_host:
            readers.add(host)
        for dst in sorted(readers - {where}):
            direction = "h2d" if kinds[where] == "cpu" else "d2h"
            copy_s += t[f"{direction}_s"]
            nbytes[direction] += t["bytes"]
            copies.add((t["name"], where, dst))
    return {"total_s": compute + copy_s, "compute_s": compute, "copy_s": copy_s,
            "pcie_bytes": nbytes, "copies": copies}


def assert_consistent(doc: dict, outputs_on_host: bool | None = None) -> dict:
    """The JSON's totals, copies and PCIe bytes equal the recomputation; every device's
    memory fits what is usable there."""
    mine = recompute(doc, outputs_on_host)
    assert doc["total_s"] == pytest.approx(mine["total_s"], rel=1e-9, abs=1e-15)
    assert doc["compute_s"] + doc["copy_s"] == pytest.approx(mine["total_s"], rel=1e-9, abs=1e-15)
    assert {(c["tensor"], c["src"], c["dst"]) for c in doc["copies"]} == mine["copies"]
    for d in ("h2d", "d2h"):
        assert doc["pcie_bytes"][d] == pytest.approx(mine["pcie_bytes"][d], rel=1e-12)
    for name, mem in doc["memory"].items():
        if mem["usable_bytes"] is not None:
            assert mem["used_bytes"] <= mem["usable_bytes"] * (1 + 1e-12), name
    return mine
