"""Every worker net and init net of a cluster plan is a valid Caffe2 net: real Caffe2
(torch 1.8.1) builds each one (``workspace.CreateNet`` constructs every operator and checks
it against its schema: SendTensor / ReceiveTensor / CreateCommonWorld / Allreduce inputs,
outputs and arguments). Devices are mapped to the CPU (the oracle has no CUDA; its GPU
copies become ``Copy``, as tests/test_rewrite_devices.py does), and the
MPI engine, which this build lacks, falls back to Caffe2's default engine at construction
(it would only refuse to run)."""
from __future__ import annotations

import pytest

from caffe2_oracle import run_caffe2
from cluster_cases import dp_linear, tiny_cluster
from test_cluster import _forced_split
from placer.rewrite.manifest import placed_types
from placer.rewrite.netdef import place
from placer.rewrite.workers import split_workers

pytestmark = pytest.mark.caffe2

SCRIPT = """
from google.protobuf import text_format
out = {}
for name, (predict, init, fed) in inputs_json.items():
    for which, text in (("init", init), ("predict", predict)):
        workspace.ResetWorkspace()
        net = caffe2_pb2.NetDef()
        text_format.Merge(text, net)
        for op in net.op:
            op.device_option.device_type = 0      # no CUDA in the oracle: GPU copies become CPU copies
            op.device_option.device_id = 0
            if op.type in ("CopyCPUToGPU", "CopyGPUToCPU"):
                op.type = "Copy"
        made = set()
        if which == "predict":
            init_net = caffe2_pb2.NetDef()
            text_format.Merge(init, init_net)
            made = {o for op in init_net.op for o in op.output}
        for blob in net.external_input:
            dtype = np.int64 if blob == "comm_world" else np.float32
            workspace.FeedBlob(blob, np.zeros(2 if blob == "comm_world" else 1, dtype))
        try:
            workspace.CreateNet(net)
            out[name + "/" + which] = "ok"
        except Exception as e:
            out[name + "/" + which] = str(e).splitlines()[0][:300]
        out[name + "/" + which + "/types"] = sorted({op.type for op in net.op})
save_json(out)
"""


def _texts(split) -> dict:
    from google.protobuf import text_format
    return {w.host: (text_format.MessageToString(w.predict), text_format.MessageToString(w.init), w.inputs)
            for w in split.workers}


def _oracle(nets: dict) -> dict:
    import json
    script = "inputs_json = json.loads(" + repr(json.dumps(nets)) + ")\n" + SCRIPT
    _, obj = run_caffe2(script)
    return obj


def test_worker_nets_of_a_model_parallel_plan_build_in_caffe2():
    typed, c, result = _forced_split()
    placed = place(typed.net, result.plan.placement, c)
    types = placed_types(placed.predict, placed.init, typed.blobs, typed.net.data_inputs)
    split = split_workers(placed.predict, placed.init, c, types, typed.net.data_inputs)
    got = _oracle(_texts(split))
    for host in ("h0", "h1"):
        assert got[f"{host}/init"] == "ok" and got[f"{host}/predict"] == "ok", got
        assert {"SendTensor", "ReceiveTensor"} <= set(got[f"{host}/predict/types"])
        assert "CreateCommonWorld" in got[f"{host}/init/types"]


def test_worker_nets_of_a_data_parallel_step_build_in_caffe2():
    predict, init, inputs, _, types = dp_linear(("h0/cpu", "h1/cpu"))
    split = split_workers(predict, init, tiny_cluster(1), types, list(inputs))
    got = _oracle(_texts(split))
    for host in ("h0", "h1"):
        assert got[f"{host}/init"] == "ok" and got[f"{host}/predict"] == "ok", got
        assert "Allreduce" in got[f"{host}/predict/types"]


def test_a_receive_with_one_output_is_what_caffe2_refuses():
    """The check above can fail: Caffe2 rejects a ReceiveTensor without its three outputs."""
    typed, c, result = _forced_split()
    placed = place(typed.net, result.plan.placement, c)
    types = placed_types(placed.predict, placed.init, typed.blobs, typed.net.data_inputs)
    split = split_workers(placed.predict, placed.init, c, types, typed.net.data_inputs)
    w = split.workers[1]
    recv = next(op for op in w.predict.op if op.type == "ReceiveTensor")
    del recv.output[1:]
    got = _oracle({"h1": _texts(split)["h1"]})
    assert "schema" in got["h1/predict"].lower() or "Output size" in got["h1/predict"], got
