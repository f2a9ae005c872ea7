"""Conformance cases run by real Caffe2 in one subprocess, and the same cases' inputs here.

A case is a dict: ``id``, Caffe2 ``op`` type, ``args``, ``inputs`` (specs below),
``n_outputs``, and optionally ``inplace`` ({input index: output index}: the output blob
is named like that input, as Caffe2 requires for in-place ops), ``mutex`` (input indices
made by ``CreateMutex`` instead of fed), ``tol`` (relative tolerance, default 1e-5) and
``atol`` (default 1e-6).

Input specs (values drawn from a generator seeded by the case id):
  randn(*shape, scale=, dtype=), uniform(low, high, *shape), randint(low, high, *shape),
  given(values, dtype), mask(*shape, keep=) (bool), counter(value) (int64 [1]),
  forward(op, [input indices], args, output=k): output k of placer's own forward kernel
  on other (drawn) inputs (e.g. MaxPool's Y for MaxPoolGradient). Caffe2 and placer both get
  the same arrays, so a forward slip cannot hide a gradient error; torch references
  recompute from the raw inputs.
"""
from __future__ import annotations

import json
import zlib

import numpy as np

from caffe2_oracle import run_caffe2
from placer.ops import registry
from placer.types import Args


def randn(*shape, scale=1.0, dtype="float32"):
    return {"kind": "randn", "shape": shape, "scale": scale, "dtype": dtype}


def uniform(low, high, *shape, dtype="float32"):
    return {"kind": "uniform", "shape": shape, "low": low, "high": high, "dtype": dtype}


def randint(low, high, *shape, dtype="int32"):
    """Integers in [low, high)."""
    return {"kind": "randint", "shape": shape, "low": low, "high": high, "dtype": dtype}


def given(values, dtype="float32"):
    return {"kind": "given", "values": values, "dtype": dtype}


def mask(*shape, keep=0.7):
    return {"kind": "mask", "shape": shape, "keep": keep}


def counter(value):
    return given([value], "int64")


def scalar(value, dtype="float32"):
    return given([value], dtype)


def forward(op, of, args=None, output=0):
    return {"kind": "forward", "op": op, "of": list(of), "args": dict(args or {}), "output": output}


def _make(spec, rng, made):
    kind = spec["kind"]
    if kind == "given":
        return np.array(spec["values"], dtype=spec["dtype"])
    if kind == "randn":
        return (rng.standard_normal(spec["shape"]) * spec["scale"]).astype(spec["dtype"])
    if kind == "uniform":
        return rng.uniform(spec["low"], spec["high"], spec["shape"]).astype(spec["dtype"])
    if kind == "randint":
        return rng.integers(spec["low"], spec["high"], spec["shape"]).astype(spec["dtype"])
    if kind == "mask":
        return rng.uniform(0, 1, spec["shape"]) < spec["keep"]
    if kind == "forward":
        outs = registry.get(spec["op"]).kernel(np, [made[i] for i in spec["of"]],
                                               Args(spec["args"], op=spec["op"]))
        return np.ascontiguousarray(outs[spec["output"]])
    raise ValueError(kind)


def case_inputs(case) -> list[np.ndarray | None]:
    """The case's input arrays (None where a mutex blob stands)."""
    rng = np.random.default_rng(zlib.crc32(case["id"].encode()))
    made: list = [None] * len(case["inputs"])
    for i, spec in enumerate(case["inputs"]):       # drawn inputs first, in order
        if i not in case.get("mutex", ()) and spec["kind"] != "forward":
            made[i] = _make(spec, rng, made)
    for i, spec in enumerate(case["inputs"]):       # then forward outputs of them
        if i not in case.get("mutex", ()) and spec["kind"] == "forward":
            made[i] = _make(spec, rng, made)
    return made


def case_args(case) -> Args:
    return Args(case["args"], op=f"#0 {case['op']} '{case['id']}'", seed=7, n_outputs=case["n_outputs"])


def blob_names(case) -> tuple[list[str], list[str]]:
    ins = [f"{case['id']}__in{i}" for i in range(len(case["inputs"]))]
    outs = [f"{case['id']}__out{k}" for k in range(case["n_outputs"])]
    for i, k in case.get("inplace", {}).items():
        outs[int(k)] = ins[int(i)]
    return ins, outs


_SCRIPT = """
cases = json.loads(CASES)
errors = {}
for case in cases:
    for name in case["feed"]:
        workspace.FeedBlob(name, inputs[name])
    for name in case["mutex_blobs"]:
        workspace.RunOperatorOnce(core.CreateOperator("CreateMutex", [], [name]))
    try:
        workspace.RunOperatorOnce(core.CreateOperator(case["op"], case["ins"], case["outs"], **case["args"]))
        save(**{case["id"] + "__result" + str(k): workspace.FetchBlob(o) for k, o in enumerate(case["outs"])})
    except Exception as e:
        errors[case["id"]] = str(e).splitlines()[0]
save_json(errors)
"""


def run_in_caffe2(cases) -> tuple[dict[str, list[np.ndarray]], dict[str, str]]:
    """Every case through Caffe2's own operator in one subprocess: ({id: outputs}, {id: error})."""
    feed, plan = {}, []
    for case in cases:
        ins, outs = blob_names(case)
        arrays = case_inputs(case)
        mutexes = [ins[i] for i in case.get("mutex", ())]
        for name, value in zip(ins, arrays):
            if value is not None:
                feed[name] = value
        plan.append({"id": case["id"], "op": case["op"], "args": case["args"], "ins": ins, "outs": outs,
                     "feed": [n for n, v in zip(ins, arrays) if v is not None], "mutex_blobs": mutexes})
    script = f"CASES = {json.dumps(json.dumps(plan))}\n" + _SCRIPT
    arrays, errors = run_caffe2(script, feed)
    results = {c["id"]: [arrays[f"{c['id']}__result{k}"] for k in range(c["n_outputs"])]
               for c in cases if c["id"] not in errors}
    return results, errors


def assert_close(got, want, case, label=""):
    tol, atol = case.get("tol", 1e-5), case.get("atol", 1e-6)
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (label, got.shape, want.shape)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=label)
    else:
        np.testing.assert_allclose(got, want, rtol=tol, atol=atol, err_msg=label)
