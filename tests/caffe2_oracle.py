"""Real Caffe2 as the test oracle: scripts run by the caffe2.python of torch 1.8.1.

Real Caffe2 cannot share placer's Python (it needs Python 3.8 and an old numpy and
protobuf), so a test hands it a script, runs it as a subprocess, and reads back what the
script saved. ``.ci/run`` builds the virtual environment (``../shared/tools/caffe2-venv.sh``,
cached in ``~/.cache/placer-caffe2-venv``); the python used is, in order:
``$PLACER_CAFFE2_PYTHON``, then that cache. Without it, tests marked ``caffe2`` skip,
except under ``CI=true``, where they fail.

A script sees these names (and nothing of placer):
  ``np``, ``core``, ``workspace``, ``caffe2_pb2``, ``text_format``: the usual imports;
  ``inputs``: a dict of the arrays passed in (loaded from an npz);
  ``save(**arrays)``: arrays to send back (numpy; loaded with ``allow_pickle=False``);
  ``save_json(obj)``: a JSON-able object to send back;
  ``net_text(net)``: a NetDef (or ``core.Net``) as protobuf text, for ``save_json``.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import textwrap
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
DEFAULT_VENV = Path.home() / ".cache" / "placer-caffe2-venv"

PRELUDE = '''
import json, os, sys
import numpy as np
from caffe2.python import core, workspace
from caffe2.proto import caffe2_pb2
from google.protobuf import text_format
workspace.GlobalInit(["caffe2", "--caffe2_log_level=2"])
_in = os.environ["PLACER_ORACLE_IN"]
inputs = dict(np.load(_in, allow_pickle=False)) if os.path.exists(_in) else {}
_saved = {}
def save(**arrays):
    _saved.update({k: np.asarray(v) for k, v in arrays.items()})
_json = [None]
def save_json(obj):
    _json[0] = obj
def net_text(net):
    proto = net.Proto() if hasattr(net, "Proto") else net
    return text_format.MessageToString(proto)
'''

EPILOGUE = '''
np.savez(os.environ["PLACER_ORACLE_OUT"] + ".npz", **_saved)
with open(os.environ["PLACER_ORACLE_OUT"] + ".json", "w") as _f:
    json.dump(_json[0], _f)
'''


@lru_cache(maxsize=1)
def caffe2_python() -> str | None:
    """The python of the Caffe2 virtual environment, or None when there is none."""
    candidates = [os.environ.get("PLACER_CAFFE2_PYTHON"), str(DEFAULT_VENV / "bin" / "python")]
    for py in candidates:
        if not py or not Path(py).exists():
            continue
        probe = subprocess.run([py, "-c", "from caffe2.python import workspace"],
                               capture_output=True, timeout=120)
        if probe.returncode == 0:
            return py
    return None


def require_caffe2() -> str:
    """The Caffe2 python, or a skip (a failure under CI=true)."""
    py = caffe2_python()
    if py is None:
        msg = ("real Caffe2 is not available: build it with ../shared/tools/caffe2-venv.sh "
               "or set PLACER_CAFFE2_PYTHON")
        if IN_CI:
            pytest.fail("CI=true but " + msg)
        pytest.skip(msg)
    return py


# Caffe2's ONNX backend (caffe2.python.onnx) imports the onnx package, which the Caffe2 venv
# lacks: .ci/run installs onnx 1.8.1 (the release torch 1.8.1 was built against) here with
# `pip install --target`, and scripts run with ``onnx=True`` get it on their path.
ONNX_SITE = Path.home() / ".cache" / "placer-caffe2-onnx"
ONNX_INSTALL = ("{py} -m pip install --target ~/.cache/placer-caffe2-onnx --no-deps onnx==1.8.1")


def require_caffe2_onnx() -> str:
    """The Caffe2 python with onnx 1.8.1 beside it, or a skip (a failure under CI=true)."""
    py = require_caffe2()
    if not (ONNX_SITE / "onnx" / "__init__.py").exists():
        msg = f"Caffe2's ONNX backend needs onnx 1.8.1: {ONNX_INSTALL.format(py=py)}"
        if IN_CI:
            pytest.fail("CI=true but " + msg)
        pytest.skip(msg)
    return py


class OracleError(AssertionError):
    """The oracle script failed; the message carries its stderr."""


def run_caffe2(script: str, inputs: dict[str, np.ndarray] | None = None,
               timeout: float = 300.0, onnx: bool = False) -> tuple[dict[str, np.ndarray], object]:
    """Run ``script`` in real Caffe2; returns (saved arrays, saved JSON object). With
    ``onnx`` the script can import onnx and ``caffe2.python.onnx.backend``."""
    py = require_caffe2_onnx() if onnx else require_caffe2()
    with tempfile.TemporaryDirectory(prefix="placer-oracle-") as tmp:
        tmp = Path(tmp)
        src = tmp / "script.py"
        src.write_text(PRELUDE + textwrap.dedent(script) + EPILOGUE)
        inp, out = tmp / "in.npz", tmp / "out"
        if inputs:
            np.savez(inp, **{k: np.asarray(v) for k, v in inputs.items()})
        env = {**os.environ, "PLACER_ORACLE_IN": str(inp), "PLACER_ORACLE_OUT": str(out),
               "GLOG_minloglevel": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ONNX_SITE) if onnx else ""}
        proc = subprocess.run([py, str(src)], capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=tmp)
        if proc.returncode != 0:
            err = proc.stderr
            first = next((l for l in err.splitlines() if "enforce fail" in l or "Error" in l), "")
            raise OracleError(f"Caffe2 oracle script failed ({proc.returncode}): {first[:1000]}\n{err[-3000:]}")
        with np.load(str(out) + ".npz", allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        obj = json.loads((Path(str(out) + ".json")).read_text())
    return arrays, obj


RUN_OPERATOR = '''
op = core.CreateOperator(OP_TYPE, INPUTS, OUTPUTS, **ARGS)
for name in INPUTS:
    workspace.FeedBlob(name, inputs[name])
workspace.RunOperatorOnce(op)
save(**{name: workspace.FetchBlob(name) for name in OUTPUTS})
'''


def run_operator(op_type: str, arrays, args: dict, n_outputs: int = 1) -> list[np.ndarray]:
    """One operator run once in real Caffe2 (``RunOperatorOnce``) on ``arrays``: its outputs."""
    names = [f"x{i}" for i in range(len(arrays))]
    outs = [f"y{i}" for i in range(n_outputs)]
    script = f"OP_TYPE = {op_type!r}\nINPUTS = {names!r}\nOUTPUTS = {outs!r}\nARGS = {args!r}\n" + RUN_OPERATOR
    saved, _ = run_caffe2(script, dict(zip(names, arrays)))
    return [saved[o] for o in outs]
