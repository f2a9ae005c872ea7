"""Caffe2 NetDef reading, writing and Net building (placer.formats.caffe2, formats.load_net)."""
from __future__ import annotations

import pytest

from conftest import corpus_files
from placer.errors import NetParseError, PlacerError
from placer.formats import caffe2_pb as pb
from placer.formats import load_net, sniff_format
from placer.formats.caffe2 import (decode_args, load_netdef, net_from_netdef, params_from_init,
                                   parse_text, read_netdef, rename_old_fields, save_netdef)
from placer.types import Device, TensorType

CAFFE2_FILES = corpus_files("caffe2")


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


# ---------------------------------------------------------------- corpus round trips

@pytest.mark.corpus
@pytest.mark.parametrize("path", CAFFE2_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("suffix", [".pbtxt", ".pb"])
def test_corpus_round_trip_is_equal(path, suffix, tmp_path):
    original = load_netdef(path)
    out = tmp_path / f"copy{suffix}"
    save_netdef(original, out)
    again, fmt = read_netdef(out)
    assert fmt == ("caffe2-binary" if suffix == ".pb" else "caffe2-text")
    assert again == original
    assert again.SerializeToString(deterministic=True) == original.SerializeToString(deterministic=True)


@pytest.mark.corpus
def test_binary_files_named_pbtxt_are_sniffed(corpus):
    netdef, fmt = read_netdef(corpus / "caffe2" / "yolov3_net.pbtxt")
    assert fmt == "caffe2-binary"
    assert len(netdef.op) == 251  # PROVENANCE.md
    assert netdef.op[0].debug_info  # field 10 survives


@pytest.mark.corpus
def test_corpus_op_counts_match_provenance(corpus):
    counts = {"alexnet_predict_net.pbtxt": 23, "resnet50_predict_net.pbtxt": 175,
              "squeezenet_predict_net.pb": 66, "crayon_predict.pb": 22,
              "glow_empty_predict_net.pbtxt": 0, "ssd300_train_net.pbtxt": 356}
    for name, n in counts.items():
        assert len(load_netdef(corpus / "caffe2" / name).op) == n, name


@pytest.mark.corpus
def test_unchanged_fields_survive_text_round_trip(corpus, tmp_path):
    src = load_netdef(corpus / "caffe2" / "glow_pre_partitioned_multi_op_predict_net.pbtxt")
    save_netdef(src, tmp_path / "p.pbtxt")
    back = load_netdef(tmp_path / "p.pbtxt")
    assert [p.name for p in back.partition_info] == ["p0", "p1", "p2", "unused_p3"]
    assert list(back.partition_info[1].device_id) == [0, 1]
    assert back.partition_info[2].backend_options[0].option[1].val == "val2"
    assert back.op[0].device_option.node_name == "p1"


@pytest.mark.corpus
def test_nested_nets_kept(corpus):
    net = load_net(corpus / "caffe2" / "maskrcnn2go_fp32_model.pbtxt")
    if_op = next(op for op in net.ops if op.type == "If")
    else_net = if_op.args["else_net"]
    assert isinstance(else_net, pb.NetDef)
    assert else_net.name == "mask_net" and len(else_net.op) > 10
    assert if_op.args["then_net"].name == "emptynet"


@pytest.mark.corpus
def test_every_corpus_predict_net_loads(corpus):
    """Each Caffe2 file loads into a Net (the one whose parameter blob only its init net
    names loads with that init net)."""
    d = corpus / "caffe2"
    pairs = {"glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt":
             "glow_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt"}
    for path in CAFFE2_FILES:
        init = pairs.get(path.name)
        net = load_net(path, init_path=d / init if init else None)
        assert len(net.ops) == len(load_netdef(path).op)


@pytest.mark.corpus
def test_devices_from_corpus(corpus):
    d = corpus / "caffe2"
    yolo = load_net(d / "yolov3_net.pbtxt")
    assert {op.device for op in yolo.ops} == {Device("gpu", 0)}
    assert {op.engine for op in yolo.ops} == {"CUDNN"}
    resnet = load_net(d / "resnet50_predict_net.pbtxt")  # every op: empty device_option {}
    assert {op.device for op in resnet.ops} == {Device("cpu", 0)}
    alexnet = load_net(d / "alexnet_predict_net.pbtxt")  # no device_option at all
    assert {op.device for op in alexnet.ops} == {None}


@pytest.mark.corpus
def test_params_from_corpus_init_nets(corpus):
    d = corpus / "caffe2"
    glow = params_from_init(load_netdef(d / "glow_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt"))
    assert glow == {"data": TensorType((3, 10), "uint8")}
    index = params_from_init(load_netdef(d / "glow_gather_const_fold_init.pbtxt"))
    assert index == {"index": TensorType((4,), "int32")}
    crayon = params_from_init(load_netdef(d / "crayon_init.pb"))
    assert len(crayon) == 60
    predict = load_netdef(d / "crayon_predict.pb")
    assert set(predict.external_input) >= set(crayon)


def test_unknown_fields_survive_binary_and_text_refuses_to_drop_them(tmp_path):
    op = pb.OperatorDef(type="Relu", input=["a"], output=["b"])
    op_bytes = op.SerializeToString() + b"\x98\x06\x01"  # field 99, varint 1: not in the schema
    raw = b"\n\x01x" + b"\x12" + bytes([len(op_bytes)]) + op_bytes
    p = _write(tmp_path, "newer.pb", raw)
    netdef = load_netdef(p)
    assert netdef.op[0].type == "Relu"
    save_netdef(netdef, tmp_path / "copy.pb")
    assert (tmp_path / "copy.pb").read_bytes() == raw
    with pytest.raises(PlacerError, match="binary"):
        save_netdef(netdef, tmp_path / "copy.pbtxt")
    assert not (tmp_path / "copy.pbtxt").exists()


EVERY_FIELD = '''name: "all" type: "dag" num_workers: 4
device_option { device_type: 1 device_id: 0 random_seed: 7 node_name: "n0" numa_node_id: 1 extra_info: "k=v" }
arg { name: "net_level" s: "x" }
op { input: "x" output: "y" name: "op0" type: "CustomThing" engine: "DEPTHWISE_3x3,NNPACK"
  control_input: "x" is_gradient_op: true debug_info: "File \\"a.py\\", line 1" domain: "caffe2" op_version: 3
  arg { name: "unknown_to_placer" ints: 1 ints: 2 }
  arg { name: "t" t { dims: 2 data_type: INT64 int64_data: 5 int64_data: 6 name: "tt" } }
  arg { name: "q" qtensors { dims: 1 precision: 8 scale: 0.5 bias: 0 is_signed: false data: 3 } }
  arg { name: "nets" nets { name: "a" op { type: "Relu" input: "p" output: "q" } } nets { name: "b" } } }
external_input: "x" external_output: "y"
partition_info { name: "p" device_id: 0 extra_info: "e" backend_options { backend_name: "B" option { key: "k" val: "v" } } }
'''


@pytest.mark.parametrize("suffix", [".pbtxt", ".pb"])
def test_every_field_survives(tmp_path, suffix):
    netdef = parse_text(EVERY_FIELD)
    save_netdef(netdef, tmp_path / f"n{suffix}")
    back = load_netdef(tmp_path / f"n{suffix}")
    assert back == netdef
    op = back.op[0]
    assert (op.engine, op.debug_info, op.domain, op.op_version) == (
        "DEPTHWISE_3x3,NNPACK", 'File "a.py", line 1', "caffe2", 3)
    assert list(op.control_input) == ["x"] and op.is_gradient_op
    assert back.partition_info[0].backend_options[0].option[0].val == "v"
    assert back.device_option.extra_info == ["k=v"] and back.num_workers == 4
    net = net_from_netdef(back)
    assert net.ops[0].args["t"].int64_data == [5, 6]
    assert [n.name for n in net.ops[0].args["nets"]] == ["a", "b"]
    assert net.ops[0].args.seed == 7  # from the net-level device option


def test_old_file_written_back_uses_the_current_name(tmp_path):
    p = _write(tmp_path, "old.pbtxt", 'op { type: "Relu" input: "x" output: "y" '
               'device_option { device_type: 1 cuda_gpu_id: 2 } } external_input: "x"')
    save_netdef(load_netdef(p), tmp_path / "new.pbtxt")
    text = (tmp_path / "new.pbtxt").read_text()
    assert "device_id: 2" in text and "cuda_gpu_id" not in text
    assert load_netdef(tmp_path / "new.pbtxt") == load_netdef(p)


# ---------------------------------------------------------------- text details

def test_old_device_id_name_is_accepted(tmp_path):
    p = _write(tmp_path, "old.pbtxt", 'name: "cuda_gpu_id"\nop { input: "x" output: "y" type: "Relu"\n'
               '  device_option { device_type: 1 cuda_gpu_id: 3 } }\nexternal_input: "x"\n')
    netdef = load_netdef(p)
    assert netdef.name == "cuda_gpu_id"  # quoted strings untouched
    assert netdef.op[0].device_option.device_id == 3
    net = load_net(p)
    assert net.ops[0].device == Device("gpu", 3)


def test_byte_order_mark_and_crlf(tmp_path):
    p = _write(tmp_path, "bom.pbtxt", b'\xef\xbb\xbfname: "n"\r\nop { type: "Relu" input: "x" output: "y" }\r\n'
                                     b'external_input: "x"\r\n')
    assert load_netdef(p).op[0].type == "Relu"


def test_rename_keeps_columns_and_strings():
    text = 'a: "cuda_gpu_id: 1" # cuda_gpu_id: 2\n cuda_gpu_id : 4'
    out = rename_old_fields(text)
    assert len(out) == len(text)
    assert out.splitlines()[0] == text.splitlines()[0]
    assert out.splitlines()[1].split() == ["device_id", ":", "4"]


def test_syntax_error_has_line_and_column(tmp_path):
    p = _write(tmp_path, "bad.pbtxt", 'name: "x"\nop {\n  type: "Relu"\n  inputt: "a"\n}\n')
    with pytest.raises(NetParseError) as e:
        load_netdef(p)
    assert (e.value.line, e.value.column) == (4, 3)
    assert str(e.value).startswith(f"{p}:4:3: ")
    assert "inputt" in str(e.value)


@pytest.mark.parametrize("data, words", [
    (b"", "empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10", "not a net"),
    ('{"name": "net", "op": []}', "JSON"),
    (bytes(range(256)) * 4, "not a net"),
])
def test_not_a_net(tmp_path, data, words):
    p = _write(tmp_path, "thing.pb", data)
    with pytest.raises(NetParseError) as e:
        load_net(p)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(NetParseError, match="no such file"):
        load_net(tmp_path / "nope.pbtxt")
    with pytest.raises(NetParseError, match="directory"):
        load_net(tmp_path)


def test_sniff_format():
    assert sniff_format(b'name: "n"\nop { type: "Relu" }') == "caffe2-text"
    assert sniff_format(b'name: "n"\nlayer {\n name: "c"\n}') == "caffe-prototxt"
    assert sniff_format(b'input: "data"\ninput_dim: 1\nlayers { name: "c" }') == "caffe-prototxt"
    assert sniff_format(b"\n\x05style\x12\x02\n\x00") == "caffe2-binary"


def test_save_binary_chosen_by_suffix_or_flag(tmp_path):
    netdef = parse_text('name: "n" op { type: "Relu" input: "x" output: "y" } external_input: "x"')
    save_netdef(netdef, tmp_path / "a.pb")
    save_netdef(netdef, tmp_path / "a.txt", binary=True)
    save_netdef(netdef, tmp_path / "b.pbtxt")
    assert (tmp_path / "a.pb").read_bytes() == netdef.SerializeToString()
    assert (tmp_path / "a.txt").read_bytes() == netdef.SerializeToString()
    assert (tmp_path / "b.pbtxt").read_text().startswith('name: "n"')


# ---------------------------------------------------------------- decoding and structure

def test_decode_args_kinds():
    op = parse_text('''op { type: "T" output: "y"
      arg { name: "f" f: 0.1 } arg { name: "i" i: -3 } arg { name: "s" s: "NCHW" }
      arg { name: "raw" s: "\\377\\000" } arg { name: "fs" floats: 1.5 floats: 2 }
      arg { name: "is" ints: 1 ints: 2 } arg { name: "ss" strings: "a" strings: "b" }
      arg { name: "flag" } arg { name: "net" n { name: "inner" op { type: "Relu" } } } }''').op[0]
    args = decode_args(op, "#0 T")
    assert args.n_outputs == 1 and args.op == "#0 T"
    assert args.float("f") == 0.1
    assert args.int("i") == -3
    assert args.str("s") == "NCHW"
    assert args["raw"] == b"\xff\x00"
    assert args.floats("fs") == [1.5, 2.0]
    assert args.ints("is") == [1, 2]
    assert args.strs("ss") == ["a", "b"]
    assert args["flag"] is None and args.int("flag", 7) == 7
    assert args["net"].op[0].type == "Relu"


def test_params_from_init_fill_kinds():
    init = parse_text('''
      op { output: "w" type: "GivenTensorFill" arg { name: "shape" ints: 2 ints: 3 }
           arg { name: "values" floats: 1 floats: 2 floats: 3 floats: 4 floats: 5 floats: 6 } }
      op { output: "v" type: "GivenTensorFill" arg { name: "values" floats: 1 floats: 2 } }
      op { output: "i64" type: "GivenTensorInt64Fill" arg { name: "shape" ints: 5 } }
      op { output: "c" type: "ConstantFill" arg { name: "shape" ints: 4 } arg { name: "dtype" i: 10 } }
      op { output: "s" type: "ConstantFill" arg { name: "value" f: 1 } }
      op { output: "x" type: "XavierFill" arg { name: "shape" ints: 8 ints: 4 ints: 3 ints: 3 } }
      op { output: "q" type: "Int8GivenTensorFill" arg { name: "shape" ints: 2 ints: 2 }
           arg { name: "values" s: "abcd" } }
      op { input: "w" output: "other" type: "Relu" }''')
    params = params_from_init(init)
    assert params == {
        "w": TensorType((2, 3)), "v": TensorType((2,)), "i64": TensorType((5,), "int64"),
        "c": TensorType((4,), "int64"), "s": TensorType(()), "x": TensorType((8, 4, 3, 3)),
        "q": TensorType((2, 2), "uint8"),
    }


def test_net_default_device_and_control_inputs():
    netdef = parse_text('''device_option { device_type: 1 device_id: 1 }
      op { input: "x" output: "y" type: "Relu" control_input: "x" }
      op { input: "y" output: "z" type: "Relu" device_option { } engine: "CUDNN" name: "r2" }
      external_input: "x" external_output: "z"''')
    net = net_from_netdef(netdef, path="n.pbtxt")
    assert net.ops[0].device == Device("gpu", 1)
    assert net.ops[1].device == Device("cpu", 0)
    assert net.ops[0].control_inputs == ("x",)
    assert net.ops[1].engine == "CUDNN" and net.ops[1].label == "#1 Relu 'r2'"
    assert net.ops[1].proto is netdef.op[1]
    assert net.external_outputs == ["z"]


def test_blob_read_before_it_is_made():
    netdef = parse_text('''op { input: "b" output: "a" type: "Relu" }
      op { input: "a" output: "b" type: "Relu" } external_input: "x"''')
    with pytest.raises(NetParseError) as e:
        net_from_netdef(netdef, path="cyc.pbtxt")
    msg = str(e.value)
    assert msg.startswith("cyc.pbtxt: op #0 Relu -> 'a' reads blob 'b' before it is produced")
    assert "#1 Relu -> 'b'" in msg and "cycle" in msg


def test_blob_nothing_makes():
    netdef = parse_text('op { input: "x" input: "w" output: "y" type: "FC" } external_input: "x"')
    with pytest.raises(NetParseError, match="reads blob 'w', which no earlier op makes"):
        net_from_netdef(netdef, path="d.pbtxt")
    init = parse_text('op { output: "w" type: "GivenTensorFill" arg { name: "shape" ints: 3 ints: 4 } }')
    net = net_from_netdef(netdef, init)
    assert net.params == {"w": TensorType((3, 4))}
    assert net.data_inputs == ["x"]


def test_a_blob_the_user_feeds_becomes_an_external_input():
    netdef = parse_text('op { input: "x" input: "w" output: "y" type: "FC" } external_input: "x"')
    net = net_from_netdef(netdef, fed=["w", "x", "elsewhere"])
    assert net.external_inputs == ["x", "w"]


@pytest.mark.corpus
def test_glow_predict_net_without_its_init_net(corpus, tmp_path):
    source = corpus / "caffe2" / "glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt"
    path = tmp_path / source.name  # alone: its init net is not beside it
    path.write_bytes(source.read_bytes())
    with pytest.raises(NetParseError, match="--input data="):
        load_net(path)
    net = load_net(path, input_shapes={"data": TensorType((3, 10), "uint8")})
    assert net.external_inputs == ["indices", "lengths", "data"]


@pytest.mark.corpus
def test_init_net_beside_the_predict_net_is_found(corpus):
    path = corpus / "caffe2" / "glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt"
    net = load_net(path)
    assert net.init_path.endswith("glow_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt")
    assert net.params["data"].dtype == "uint8"
    assert load_net(corpus / "caffe2" / "alexnet_predict_net.pbtxt").init_proto is None


def test_value_info_json_gives_input_shapes():
    from placer import examples
    net = load_net(examples.path("dlrm_small"))
    assert net.init_path.endswith("dlrm_small_init.pbtxt")
    assert net.input_shapes["dense_in"] == TensorType((256, 13))
    assert net.input_shapes["emb:::sls0_i"] == TensorType((256,), "int64")


def test_in_place_ops_are_not_cycles():
    netdef = parse_text('''op { input: "x" output: "y" type: "Relu" }
      op { input: "y" output: "y" type: "Relu" } external_input: "x"''')
    assert len(net_from_netdef(netdef).ops) == 2


def test_caffe_prototxt_refuses_init_net(tmp_path):
    p = _write(tmp_path, "d.prototxt", 'name: "n"\nlayer {\n  name: "a"\n  type: "ReLU"\n}\n')
    with pytest.raises(PlacerError, match="--init-net"):
        load_net(p, init_path=p)


def test_caffe2_refuses_weights(tmp_path):
    p = _write(tmp_path, "n.pbtxt", 'op { input: "x" output: "y" type: "Relu" } external_input: "x"')
    with pytest.raises(PlacerError, match="--weights"):
        load_net(p, weights="x.caffemodel")


# ---------------------------------------------------------------- nesting depth

def _nested_if(depth: int) -> str:
    from fuzz_cases import nested_if
    return nested_if(depth)


@pytest.mark.parametrize("suffix", [".pbtxt", ".pb"])
def test_nested_nets_up_to_protobufs_depth_load_and_deeper_ones_are_refused(tmp_path, suffix):
    """protobuf's binary decoder stops at 100 message levels (33 levels of nested nets, each
    NetDef > OperatorDef > Argument); text files are held to the same bound."""
    from fuzz_cases import text_to_binary
    for depth, ok in ((33, True), (34, False)):
        text = _nested_if(depth)
        path = tmp_path / f"deep{depth}{suffix}"
        path.write_bytes(text.encode() if suffix == ".pbtxt" else text_to_binary(text))
        if ok:
            netdef = load_netdef(path)
            for _ in range(depth):  # walk down the then_nets to the innermost Relu
                netdef = netdef.op[0].arg[0].n
            assert netdef.op[0].type == "Relu"
        else:
            with pytest.raises(NetParseError, match="nested more than 33 levels"):
                load_netdef(path)


def test_nesting_past_pythons_stack_is_a_parse_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.pbtxt"
    path.write_text(_nested_if(2000))
    with pytest.raises(NetParseError, match="nested more than 33 levels"):
        load_netdef(path)


def test_message_depth_counts_message_levels():
    from placer.formats.caffe2 import message_depth, parse_text
    assert message_depth(parse_text('op { type: "Relu" input: "x" output: "y" }')) == 1
    assert message_depth(parse_text(_nested_if(1))) == 4
    assert message_depth(parse_text(_nested_if(20))) == 61


# ---------------------------------------------------------------- text written fast, as text_format writes it

def _random_netdef(rng, depth: int = 0):
    """A NetDef with what trips text printers: escapes, non-ASCII, every float (nan, -0,
    subnormal, 9-digit), enums, doubles, nested nets and tensors, empty messages."""
    import struct

    def text(as_bytes=False):
        chars = "abcXYZ_:/0. " if rng.random() < 0.6 else "".join(map(chr, range(128))) + "éß€\u2028"
        s = "".join(chars[k] for k in rng.integers(0, len(chars), rng.integers(0, 6)))
        return s.encode() if as_bytes else s

    def number():
        special = [0.0, -0.0, 1.0, 0.1, 1e-5, 1e16, 123456789.0, float("inf"), float("-inf"),
                   float("nan"), 3.4e38, 1e-45]
        if rng.random() < 0.3:
            return special[rng.integers(len(special))]
        return struct.unpack("<f", struct.pack("<I", int(rng.integers(2**32))))[0]

    def argument():
        a = pb.Argument(name=text())
        kind = rng.integers(9)
        if kind == 0:
            a.f = number()
        elif kind == 1:
            a.i = int(rng.integers(-2**62, 2**62))
        elif kind == 2:
            a.s = bytes(rng.integers(0, 256, rng.integers(0, 5)).tolist())
        elif kind == 3:
            a.floats.extend(number() for _ in range(rng.integers(0, 4)))
        elif kind == 4:
            a.ints.extend(rng.integers(-5, 5, rng.integers(0, 4)).tolist())
        elif kind == 5:
            a.strings.extend(text(True) for _ in range(rng.integers(0, 3)))
        elif kind == 6 and depth < 2:
            a.n.CopyFrom(_random_netdef(rng, depth + 1))
        elif kind == 7:
            a.t.dims.extend([2, 3])
            a.t.data_type = int(rng.choice([1, 2, 10]))
            a.t.float_data.append(number())
            a.t.double_data.append(float(rng.random()))
        if rng.random() < 0.3:
            a.f = number()
        return a

    net = pb.NetDef(name=text())
    for _ in range(rng.integers(0, 8)):
        op = net.op.add(type=text() or "X", name=text(), input=[text() for _ in range(rng.integers(3))],
                        output=[text() for _ in range(rng.integers(2))])
        op.arg.extend(argument() for _ in range(rng.integers(4)))
        if rng.random() < 0.5:
            op.device_option.device_type, op.device_option.device_id = int(rng.integers(7)), int(rng.integers(4))
        elif rng.random() < 0.3:
            op.device_option.SetInParent()  # present and empty
        if rng.random() < 0.2:
            op.is_gradient_op = bool(rng.random() < 0.5)
    if rng.random() < 0.5:
        net.arg.append(argument())
    net.external_input.extend(text() for _ in range(rng.integers(3)))
    return net


def test_netdef_text_is_text_format_text_on_random_nets():
    """protobuf's own printer is the oracle; the fast path must agree to the byte."""
    import numpy as np
    from google.protobuf import text_format

    from placer.formats.caffe2 import netdef_text
    rng = np.random.default_rng(0)
    for _ in range(2000):
        net = _random_netdef(rng)
        assert netdef_text(net) == text_format.MessageToString(net)


@pytest.mark.corpus
@pytest.mark.parametrize("path", CAFFE2_FILES, ids=lambda p: p.name)
def test_netdef_text_is_text_format_text_on_the_corpus(path):
    from google.protobuf import text_format

    from placer.formats.caffe2 import netdef_text
    netdef = load_netdef(path)
    assert netdef_text(netdef) == text_format.MessageToString(netdef)


def test_unknown_fields_are_found_however_deep():
    from placer.formats.caffe2 import has_unknown_fields
    inner = pb.NetDef(name="inner").SerializeToString() + b"\x98\x06\x01"  # field 99
    arg = pb.Argument(name="n").SerializeToString() + b"\x42" + bytes([len(inner)]) + inner  # n (8)
    op = pb.OperatorDef(type="If").SerializeToString() + b"\x2a" + bytes([len(arg)]) + arg  # arg (5)
    deep = pb.NetDef()
    deep.ParseFromString(b"\x12" + bytes([len(op)]) + op)
    assert deep.op[0].arg[0].n.name == "inner"
    assert has_unknown_fields(deep)
    assert not has_unknown_fields(pb.NetDef(name="x", op=[pb.OperatorDef(type="Relu")]))
