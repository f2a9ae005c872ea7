"""The executor, devices and RunRecord, on small nets built in code (and the corpus)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from placer.rewrite import netdef as rewrite
from placer.errors import DeviceError, InputError, KernelMissingError
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.runtime import record as run_record
from placer.runtime.devices import CpuDevice, EmulatedArray, EmulatedCudaDevice, location
from placer.runtime.executor import Executor, peak_bytes
from placer.runtime.inputs import random_inputs
from placer.types import TensorType

from conftest import corpus_files, gpu_available

CPU, GPU = 0, 1


def op(type_, inputs, outputs, device=None, name="", **args):
    p = pb.OperatorDef(type=type_, input=inputs, output=outputs, name=name)
    for key, value in args.items():
        a = p.arg.add(name=key)
        if isinstance(value, int):
            a.i = value
        elif isinstance(value, float):
            a.f = value
        elif value and isinstance(value[0], float):
            a.floats.extend(value)
        else:
            a.ints.extend(value)
    if device is not None:
        p.device_option.device_type = device
    return p


def make_net(ops, inputs, outputs, init_ops=None, name="t"):
    netdef = pb.NetDef(name=name, external_input=inputs, external_output=outputs)
    netdef.op.extend(ops)
    init = None
    if init_ops is not None:
        init = pb.NetDef(name=name + "_init")
        init.op.extend(init_ops)
    return net_from_netdef(netdef, init)


RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 8)).astype(np.float32)
W1 = RNG.standard_normal((16, 8)).astype(np.float32)
B1 = RNG.standard_normal(16).astype(np.float32)
W2 = RNG.standard_normal((5, 16)).astype(np.float32)
B2 = RNG.standard_normal(5).astype(np.float32)
FEED = {"x": X, "w1": W1, "b1": B1, "w2": W2, "b2": B2}


def mlp(devs):
    """FC -> Relu -> FC -> Sigmoid, one device per op; params fed as inputs."""
    return make_net([op("FC", ["x", "w1", "b1"], ["h"], devs[0]), op("Relu", ["h"], ["r"], devs[1]),
                     op("FC", ["r", "w2", "b2"], ["y"], devs[2]), op("Sigmoid", ["y"], ["s"], devs[3])],
                    list(FEED), ["s"])


def mlp_numpy():
    h = np.maximum(X @ W1.T + B1, 0)
    return 1 / (1 + np.exp(-(h @ W2.T + B2)))


def test_all_cpu_matches_numpy_and_all_gpu_emulated_matches_cpu():
    cpu = Executor(mlp([None] * 4)).run(FEED)["s"]
    np.testing.assert_allclose(cpu, mlp_numpy(), rtol=1e-5, atol=1e-6)
    ex = Executor(mlp([GPU] * 4), emulate_gpu=True)
    gpu = ex.run(FEED)["s"]
    assert type(gpu) is np.ndarray  # outputs come back to the host as plain arrays
    np.testing.assert_allclose(gpu, cpu, rtol=1e-6)
    assert ex.record.devices == ("cpu", "emulated-cuda:0")
    assert {o.device for o in ex.record.ops} == {"emulated-cuda:0"}
    assert ex.record.emulated and "CPU timing" in ex.record.timing_labels["emulated-cuda:0"]


def test_no_annotation_runs_on_cpu():
    ex = Executor(mlp([None] * 4))
    ex.run(FEED)
    assert ex.record.devices == ("cpu",) and not ex.record.emulated


def test_mixed_placement_with_copies_matches_cpu():
    net = make_net([op("FC", ["x", "w1", "b1"], ["h"], CPU),
                    op("CopyCPUToGPU", ["h"], ["h_gpu0"], GPU),
                    op("Relu", ["h_gpu0"], ["r"], GPU),
                    op("CopyGPUToCPU", ["r"], ["r_cpu"], GPU),
                    op("FC", ["r_cpu", "w2", "b2"], ["y"], CPU),
                    op("Sigmoid", ["y"], ["s"], CPU)], list(FEED), ["s"])
    ex = Executor(net, emulate_gpu=True)
    np.testing.assert_allclose(ex.run(FEED)["s"], mlp_numpy(), rtol=1e-5, atol=1e-6)
    copies = [(o.type, o.copy_bytes, o.copy_direction) for o in ex.record.ops if o.copy_direction]
    assert copies == [("CopyCPUToGPU", 4 * 16 * 4, "h2d"), ("CopyGPUToCPU", 4 * 16 * 4, "d2h")]
    assert ex.record.copy_bytes() == 512 and ex.record.copy_bytes("h2d") == 256


def test_caffe2_docs_seed_example_fc_cpu_sigmoid_and_softmaxwithloss_gpu():
    """FC on the CPU feeding Sigmoid and SoftmaxWithLoss on the GPU through CopyCPUToGPU."""
    label = np.array([1, 0, 4, 2], dtype=np.int32)
    feed = {"x": X, "w2": W2[:, :8].copy(), "b2": B2, "label": label}

    def net(placed):
        d_fc, d_gpu = (CPU, GPU) if placed else (None, None)
        copy = [op("CopyCPUToGPU", ["fc"], ["fc_gpu0"], GPU),
                op("CopyCPUToGPU", ["label"], ["label_gpu0"], GPU)] if placed else []
        fc, lab = ("fc_gpu0", "label_gpu0") if placed else ("fc", "label")
        return make_net([op("FC", ["x", "w2", "b2"], ["fc"], d_fc), *copy,
                         op("Sigmoid", [fc], ["pred"], d_gpu),
                         op("SoftmaxWithLoss", [fc, lab], ["softmax", "loss"], d_gpu)],
                        list(feed), ["pred", "softmax", "loss"])

    want = Executor(net(False)).run(feed)
    got = Executor(net(True), emulate_gpu=True).run(feed)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
    logits = X @ feed["w2"].T + B2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(want["loss"], -np.log(p[np.arange(4), label]).mean(), rtol=1e-5)


def test_missing_copy_names_op_blob_and_both_devices():
    net = make_net([op("FC", ["x", "w1", "b1"], ["h"], CPU),
                    op("Relu", ["h"], ["r"], GPU, name="relu_on_gpu")], ["x", "w1", "b1"], ["r"])
    with pytest.raises(DeviceError) as e:
        Executor(net, emulate_gpu=True).run({"x": X, "w1": W1, "b1": B1})
    msg = str(e.value)
    assert "relu_on_gpu" in msg and "'h'" in msg and "emulated-cuda:0" in msg and "on cpu" in msg
    assert "CopyCPUToGPU" in msg


def test_copy_from_the_wrong_side_is_refused():
    net = make_net([op("Relu", ["x"], ["r"], CPU), op("CopyGPUToCPU", ["r"], ["r_cpu"], GPU)], ["x"], ["r_cpu"])
    with pytest.raises(DeviceError, match=r"CopyGPUToCPU -> 'r_cpu' reads 'r' on emulated-cuda:0, but the blob is on cpu"):
        Executor(net, emulate_gpu=True).run({"x": X})


def test_in_place_ops():
    for dev in (None, GPU):
        net = make_net([op("Relu", ["x"], ["x"], dev), op("Sigmoid", ["x"], ["x"], dev)], ["x"], ["x"])
        out = Executor(net, emulate_gpu=True).run({"x": X})["x"]
        np.testing.assert_allclose(out, 1 / (1 + np.exp(-np.maximum(X, 0))), rtol=1e-6)
    assert X.min() < 0  # the caller's array is not touched


def test_missing_and_wrong_inputs_list_what_the_net_expects():
    net = make_net([op("Relu", ["x"], ["r"])], ["x"], ["r"])
    ex = Executor(net, input_types={"x": TensorType((4, 8), "float32")})
    with pytest.raises(InputError, match=r"'x' is missing; the net expects: x float32\[4,8\]"):
        ex.run({})
    with pytest.raises(InputError, match=r"'x' has dtype float64, expected float32"):
        ex.run({"x": X.astype(np.float64)})
    with pytest.raises(InputError, match=r"'x' has shape \(2, 8\), expected \(4, 8\)"):
        ex.run({"x": X[:2]})


def test_ops_without_kernels_are_refused_before_anything_runs_listing_all():
    net = make_net([op("Relu", ["x"], ["a"]), op("NoSuchOp", ["a"], ["b"], name="first"),
                    op("AlsoUnknown", ["b"], ["c"], name="second")], ["x"], ["c"])
    with pytest.raises(KernelMissingError) as e:
        Executor(net)
    assert "2 op(s)" in str(e.value) and "'first'" in str(e.value) and "'second'" in str(e.value)


def test_gpu_net_without_gpu_tells_to_emulate():
    if gpu_available():
        pytest.skip("a GPU is visible")
    net = make_net([op("Relu", ["x"], ["r"], GPU)], ["x"], ["r"])
    with pytest.raises(DeviceError, match="--emulate-gpu"):
        Executor(net)


def test_peak_memory_and_copy_bytes_by_hand():
    """x[4,8] f32 (128 B), w1 16x8 (512 B), b1 (64 B) fed on the CPU.
    op0 FC -> h (256 B): cpu 128+512+64+256 = 960 (peak), then x, w1, b1 die -> 256.
    op1 copy h -> h_gpu0: gpu 256; h dies. op2 Relu -> r: gpu 512 (peak); h_gpu0 dies.
    op3 copy r -> r_cpu: cpu 256, gpu 256 -> r dies."""
    net = make_net([op("FC", ["x", "w1", "b1"], ["h"], CPU), op("CopyCPUToGPU", ["h"], ["h_gpu0"], GPU),
                    op("Relu", ["h_gpu0"], ["r"], GPU), op("CopyGPUToCPU", ["r"], ["r_cpu"], GPU)],
                    ["x", "w1", "b1"], ["r_cpu"])
    ex = Executor(net, emulate_gpu=True)
    ex.run({"x": X, "w1": W1, "b1": B1}, iterations=2)
    assert ex.record.peak_bytes == {"cpu": 960, "emulated-cuda:0": 512}
    assert [o.copy_bytes for o in ex.record.ops] == [0, 256, 0, 256]
    assert all(len(o.samples_s) == 2 and o.time_s > 0 for o in ex.record.ops)


def test_peak_bytes_keeps_params_and_outputs_and_counts_in_place_once():
    sizes = {"p": ("cpu", 100), "x": ("cpu", 10), "a": ("cpu", 20), "b": ("gpu", 40)}
    steps = [(("x", "p"), ("a",)), (("a",), ("a",)), (("a",), ("b",))]
    frees = [("x",), (), ("a",)]
    assert peak_bytes(steps, sizes, ["p", "x"], frees) == {"cpu": 130, "gpu": 40}


def test_init_net_fills_params_on_the_device_of_their_reader():
    init = [op("GivenTensorFill", [], ["w1"], shape=[16, 8], values=[float(v) for v in W1.ravel()]),
            op("GivenTensorFill", [], ["b1"], shape=[16], values=[float(v) for v in B1])]
    net = make_net([op("FC", ["x", "w1", "b1"], ["h"], GPU)], ["x", "w1", "b1"], ["h"], init_ops=init)
    ex = Executor(net, emulate_gpu=True)
    params = ex.run_init()
    assert location(params["w1"]) == "emulated-cuda:0"
    assert ex.expected_inputs() == ["x"]
    np.testing.assert_allclose(ex.run({"x": X})["h"], X @ W1.T + B1, rtol=1e-5)


def test_emulated_arrays_are_zero_copy_views_and_transfers_are_real_copies():
    gpu, cpu = EmulatedCudaDevice(1), CpuDevice()
    a = np.arange(6, dtype=np.float32)
    tagged = gpu.adopt(a)
    assert type(tagged) is EmulatedArray and tagged.device == "emulated-cuda:1"
    assert np.shares_memory(tagged, a) and gpu.holds(tagged) and not cpu.holds(tagged)
    moved = gpu.to_device(a)
    assert not np.shares_memory(moved, a) and location(moved) == "emulated-cuda:1"
    back = gpu.to_host(moved)
    assert type(back) is np.ndarray and cpu.holds(back) and not np.shares_memory(back, moved)


def test_run_record_json_round_trip(tmp_path):
    net = make_net([op("FC", ["x", "w1", "b1"], ["h"], CPU, name="fc1"), op("CopyCPUToGPU", ["h"], ["hg"], GPU),
                    op("Relu", ["hg"], ["r"], GPU)], ["x", "w1", "b1"], ["r"])
    ex = Executor(net, emulate_gpu=True)
    ex.run({"x": X, "w1": W1, "b1": B1}, iterations=3)
    path = tmp_path / "run.json"
    run_record.save(ex.record, path)
    back = run_record.load(path)
    assert back == ex.record
    assert back.ops[0].name == "fc1" and back.ops[1].copy_direction == "h2d"
    assert abs(back.total_s - sum(o.time_s for o in ex.record.ops)) < 1e-15


def test_random_inputs_respect_sparse_lengths_and_gather_rules():
    net = make_net([op("SparseLengthsSum", ["table", "idx", "len"], ["pooled"]),
                    op("Gather", ["table2", "gidx"], ["g"]),
                    op("SoftmaxWithLoss", ["scores", "label"], ["p", "loss"])],
                   ["table", "idx", "len", "table2", "gidx", "scores", "label"], ["pooled", "g", "loss"])
    types = {"table": TensorType((50, 4)), "idx": TensorType((37,), "int64"), "len": TensorType((6,), "int32"),
             "table2": TensorType((3, 2)), "gidx": TensorType((100,)),
             "scores": TensorType((8, 7)), "label": TensorType((8,), "int32")}
    got = random_inputs(net, types, list(types), seed=3)
    assert got["len"].sum() == 37 and got["len"].min() >= 0 and got["len"].dtype == np.int32
    assert 0 <= got["idx"].min() and got["idx"].max() < 50
    assert got["gidx"].dtype == np.int64 and got["gidx"].max() < 3 and got["gidx"].max() == 2
    assert got["label"].max() < 7 and got["scores"].dtype == np.float32
    again = random_inputs(net, types, list(types), seed=3)
    assert all(np.array_equal(got[k], again[k]) for k in got)


@pytest.mark.gpu
def test_cuda_device_round_trip_and_event_timer():
    from placer.runtime.devices import CudaDevice
    dev = CudaDevice(0)
    a = np.arange(1 << 20, dtype=np.float32)
    g = dev.to_device(a, key="t")
    assert dev.holds(g) and location(g) == "cuda:0"
    t = dev.timer()
    t.start()
    g2 = g * 2
    t.stop()
    assert t.seconds() >= 0
    np.testing.assert_array_equal(dev.to_host(g2, key="t"), a * 2)


@pytest.mark.gpu
def test_mlp_on_real_gpu_matches_cpu():
    ex = Executor(mlp([GPU] * 4))
    np.testing.assert_allclose(ex.run(FEED, iterations=2)["s"], mlp_numpy(), rtol=1e-4, atol=1e-5)
    assert ex.record.devices == ("cpu", "cuda:0") and not ex.record.emulated


# -- the corpus: every net whose op types all have kernels and whose params are known ----

CAFFE2_WITH_INIT = [("glow_gather_const_fold.pbtxt", "glow_gather_const_fold_init.pbtxt"),
                    ("glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt",
                     "glow_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt"),
                    ("crayon_predict.pb", "crayon_init.pb"),
                    ("yolov3_net.pbtxt", "yolov3_param_init_net.pbtxt"),
                    ("glow_pre_partitioned_multi_op_predict_net.pbtxt", None)]  # no params
CAFFE_NETS = [p.name for p in corpus_files("caffe", ".prototxt")]
# shapes the files do not carry (small, to keep the test fast)
CORPUS_INPUTS = {"glow_gather_const_fold.pbtxt": {"data": TensorType((2, 3, 4, 5))},
                 "glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt": {
                     "indices": TensorType((7,), "int64"), "lengths": TensorType((3,), "int32")},
                 "glow_pre_partitioned_multi_op_predict_net.pbtxt": {
                     n: TensorType((4, 4)) for n in ("mm0_in", "mm1_in", "add_in")},
                 # train/test nets whose Data layers read an LMDB: the image size of the data set
                 "mnist_lenet_train_test.prototxt": {"data": TensorType((1, 1, 28, 28))},
                 "v1_mnist_lenet_train_test.prototxt": {"data": TensorType((1, 1, 28, 28))},
                 "cifar10_full_sigmoid_train_test_bn.prototxt": {"data": TensorType((1, 3, 32, 32))},
                 "bvlc_alexnet_train_val.prototxt": {"data": TensorType((1, 3, 227, 227))}}
# nets with op types placer does not know: `run` refuses them, naming each
UNKNOWN_OP_TYPES = {"crayon_predict.pb": {"PackedInt8BGRANHWCToNCHWCStylizerPreprocess",
                                          "BRGNCHWCToPackedInt8BGRAStylizerDeprocess"},
                    "yolov3_net.pbtxt": {"Yolo"}}
SLOW_S = 20.0  # a net slower than this on one run at batch 1 is reported, not failed


@pytest.fixture
def one_blas_thread():
    """Corpus nets run single-threaded: on a loaded host 2 BLAS threads make them crawl."""
    from placer.runtime import threads
    before = threads.get_blas_threads()
    if before is not None:
        threads.set_blas_threads(1)
    yield
    if before is not None:
        threads.set_blas_threads(before)


def _corpus_case(corpus, path, init):
    from placer.formats import load_net
    from placer.shapes import infer
    given = CORPUS_INPUTS.get(path.name, {})
    net = load_net(path, init_path=init, input_shapes=given or None)  # Caffe parameter shapes follow
    batch1 = {n: TensorType((1,) + t.shape[1:], t.dtype) for n, t in net.input_shapes.items() if t.shape}
    batch1.update(given)
    ex = Executor(net, input_types={**batch1})
    typed = infer(net, batch1)
    ex.run_init()
    names = ex.expected_inputs()
    assert all(typed.blobs.get(n) is not None for n in names), "; ".join(typed.missing.values())
    feed = random_inputs(net, typed.blobs, names, seed=0)
    ex.input_types.update({n: TensorType(a.shape, str(a.dtype)) for n, a in feed.items()})
    t0 = time.perf_counter()
    out = ex.run(feed, iterations=1, warmup=0)
    seconds = time.perf_counter() - t0
    assert set(out) == set(net.external_outputs)
    for name, value in out.items():
        if value.dtype.kind == "f":
            assert np.all(np.isfinite(value)), name
        want = typed.blobs.get(name)
        if want is not None:
            assert value.shape == want.shape, name
    return out, seconds, feed


@pytest.mark.corpus
@pytest.mark.parametrize("predict,init", CAFFE2_WITH_INIT)
def test_corpus_caffe2_nets_with_init_run_end_to_end(corpus, predict, init, one_blas_thread):
    if predict in UNKNOWN_OP_TYPES:
        with pytest.raises(KernelMissingError) as e:
            _corpus_case(corpus, corpus / "caffe2" / predict, init and corpus / "caffe2" / init)
        assert all(f"{t} -> " in str(e.value) for t in UNKNOWN_OP_TYPES[predict]), str(e.value)
        assert "unknown op type" in str(e.value)
        return
    out, _, feed = _corpus_case(corpus, corpus / "caffe2" / predict, init and corpus / "caffe2" / init)
    if predict == "glow_gather_const_fold.pbtxt":  # Reshape to data's shape permuted by index
        assert out["result"].shape == (2, 4, 5, 3)
    if predict.startswith("glow_pre_partitioned"):  # res = mm0 * (mm0 @ mm1) - (mm0 @ mm1 + add)
        mm = feed["mm0_in"] @ feed["mm1_in"]
        np.testing.assert_allclose(out["res"], feed["mm0_in"] * mm - (mm + feed["add_in"]), rtol=1e-5)


@pytest.mark.corpus
@pytest.mark.parametrize("name", CAFFE_NETS)
def test_corpus_caffe_nets_run_end_to_end_on_random_weights(corpus, name, one_blas_thread):
    _, seconds, _ = _corpus_case(corpus, corpus / "caffe" / name, None)
    assert seconds < SLOW_S * 5, f"{name} took {seconds:.1f} s at batch 1"


def cpu_and_one_gpu():
    """The machine of CPU + one GPU (device 0 the host, device 1 cuda:0)."""
    from placer.hardware.machine import compose_machine
    from placer.hardware.profiles import load_device_profile
    return compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile("t4-pcie3", "gpu"))


def test_nets_placed_by_rewrite_run_emulated_and_match_cpu():
    """Every 4-op placement of the MLP, written by placer.rewrite.netdef with its copies."""
    machine = cpu_and_one_gpu()
    plain = mlp([None] * 4)
    for mask in range(16):
        placement = [mask >> k & 1 for k in range(4)]
        placed = rewrite.place(plain, placement, machine)
        net = net_from_netdef(placed.predict, placed.init)
        ex = Executor(net, emulate_gpu=True)
        got = ex.run(FEED)["s"]
        np.testing.assert_allclose(got, mlp_numpy(), rtol=1e-5, atol=1e-6, err_msg=str(placement))
        devices = [o.device for o in ex.record.ops if not o.copy_direction]
        assert devices == ["emulated-cuda:0" if d else "cpu" for d in placement]


def test_net_level_device_option_is_the_default_and_an_op_option_wins():
    netdef = pb.NetDef(name="d", external_input=["x"], external_output=["y_cpu"])
    netdef.device_option.device_type = GPU
    netdef.op.extend([op("Relu", ["x"], ["r"]), op("Sigmoid", ["r"], ["y"]),
                      op("CopyGPUToCPU", ["y"], ["y_cpu"])])
    netdef.op[1].device_option.device_type = CPU  # wins over the net's default
    ex = Executor(net_from_netdef(netdef), emulate_gpu=True)
    with pytest.raises(DeviceError, match=r"Sigmoid.*runs on cpu but its input 'r' is on emulated-cuda:0"):
        ex.run({"x": X})
    netdef.op[1].device_option.device_type = GPU
    ex = Executor(net_from_netdef(netdef), emulate_gpu=True)
    np.testing.assert_allclose(ex.run({"x": X})["y_cpu"], 1 / (1 + np.exp(-np.maximum(X, 0))), rtol=1e-6)
    # the copy is placed on (and timed on) the GPU, as Caffe2 places CopyGPUToCPU; it writes the host
    assert [o.device for o in ex.record.ops] == ["emulated-cuda:0"] * 3
    assert ex.record.ops[2].links == (("emulated-cuda:0", "cpu", X.nbytes),)


# -- the CUDA code path on a stand-in for cupy (numpy underneath), for machines without a GPU --

def test_cuda_path_on_a_cupy_stand_in(monkeypatch):
    """Placed net on "cuda:0": pinned staging for feeds and copies, event timers, outputs
    back as plain host arrays, and a host array handed to a GPU op refused."""
    import sys
    from test_runtime_multigpu import FakeCupy
    fake = FakeCupy(count=1)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    net = make_net([op("FC", ["x", "w1", "b1"], ["h"], CPU), op("CopyCPUToGPU", ["h"], ["h_gpu0"], GPU),
                    op("Relu", ["h_gpu0"], ["r"], GPU), op("CopyGPUToCPU", ["r"], ["r_cpu"], GPU),
                    op("FC", ["r_cpu", "w2", "b2"], ["y"], CPU), op("CopyCPUToGPU", ["y"], ["y_gpu0"], GPU),
                    op("Sigmoid", ["y_gpu0"], ["s"], GPU)], list(FEED), ["s"])
    ex = Executor(net)
    out = ex.run(FEED, iterations=2)
    assert type(out["s"]) is np.ndarray
    np.testing.assert_allclose(out["s"], mlp_numpy(), rtol=1e-5, atol=1e-6)
    assert ex.record.devices == ("cpu", "cuda:0") and not ex.record.emulated
    assert [o.copy_direction for o in ex.record.ops if o.copy_bytes] == ["h2d", "d2h", "h2d"]
    # every host -> device transfer went through a pinned staging buffer (bytearray-backed)
    def root(a):
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a.obj if isinstance(a, memoryview) else a
    assert len(fake.pinned_sources) == 2 * 3  # 2 h2d copies (feeds go to the CPU FC) x (1 warm-up + 2 runs)
    assert all(isinstance(root(a), bytearray) for a in fake.pinned_sources)
    assert len({id(root(a)) for a in fake.pinned_sources}) == 2  # one staging buffer per copy op, reused
    bad = make_net([op("Relu", ["x"], ["r"], CPU), op("Sigmoid", ["r"], ["s"], GPU, name="sig")], ["x"], ["s"])
    with pytest.raises(DeviceError, match=r"'sig' runs on cuda:0 but its input 'r' is on cpu"):
        Executor(bad).run({"x": X})


def test_small_dlrm_with_tables_on_cpu_and_mlps_on_emulated_gpu_matches_cpu(tmp_path):
    """The bundled DLRM structure at toy size: SparseLengthsSum lookups stay on the CPU,
    everything else goes to the GPU through rewrite's copies; random indices and lengths
    valid for their tables; same outputs as the CPU run."""
    from dataclasses import replace

    from placer.examples import dlrm
    from placer.formats import load_net
    cfg = replace(dlrm.small(max_rows=300, batch=16), table_rows=(300, 7, 120, 1), dim=16,
                  bottom=(13, 32, 16), top=(32, 1))
    builder = dlrm.build(cfg)
    files = builder.save(tmp_path, "dlrm")
    net = load_net(files["predict"], init_path=files["init"])
    types = {n: TensorType(shape, dt) for n, (dt, shape) in builder.value_info.items()}
    feed = random_inputs(net, types, list(types), seed=4)
    for name, t in types.items():
        assert feed[name].shape == t.shape
    ex = Executor(net, input_types=types)
    want = ex.run(feed)
    placement = [0 if "SparseLengths" in op.type else 1 for op in net.ops]
    placed = rewrite.place(net, placement, cpu_and_one_gpu())
    ex_gpu = Executor(net_from_netdef(placed.predict, placed.init), emulate_gpu=True, input_types=types)
    got = ex_gpu.run(feed)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    rec = ex_gpu.record
    assert rec.copy_bytes("h2d") > 0 and rec.peak_bytes["cpu"] > 0 and rec.peak_bytes["emulated-cuda:0"] > 0


def test_device_map_overrides_the_file_placement():
    from placer.types import GPU0
    ex = Executor(mlp([None] * 4), device_map={i: GPU0 for i in range(4)}, emulate_gpu=True)
    np.testing.assert_allclose(ex.run(FEED)["s"], mlp_numpy(), rtol=1e-5, atol=1e-6)
    assert [o.device for o in ex.record.ops] == ["emulated-cuda:0"] * 4
    # one op moved without a copy: the next op finds its input on the wrong device
    with pytest.raises(DeviceError, match=r"#1 Relu.*runs on cpu but its input 'h' is on emulated-cuda:0"):
        Executor(mlp([None] * 4), device_map={0: GPU0}, emulate_gpu=True).run(FEED)
