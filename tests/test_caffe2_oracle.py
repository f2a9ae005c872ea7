"""The oracle harness itself: real Caffe2 runs a script and hands back arrays and JSON."""
from __future__ import annotations

import numpy as np
import pytest

from caffe2_oracle import OracleError, run_caffe2

pytestmark = pytest.mark.caffe2


def test_oracle_runs_an_operator_and_returns_its_output():
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    arrays, obj = run_caffe2("""
        workspace.FeedBlob("x", inputs["x"])
        workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["y"]))
        save(y=workspace.FetchBlob("y"))
        save_json({"schema": workspace.C.OpSchema.get("Relu") is not None})
    """, {"x": x})
    np.testing.assert_array_equal(arrays["y"], np.maximum(x, 0))
    assert obj == {"schema": True}


def test_oracle_error_carries_caffe2s_message():
    with pytest.raises(OracleError, match="NoSuchOperator"):
        run_caffe2('workspace.RunOperatorOnce(core.CreateOperator("NoSuchOperator", [], ["y"]))')
