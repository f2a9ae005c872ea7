"""Hostile input for the command line, as data, and a runner that survives it.

A ``Case`` is an argv for ``placer.cli.main`` and the files it needs. The cases come from:

- ``mutated_corpus_cases``: nets of ../shared/nets with lines dropped, duplicated or
  swapped, a ``top``/``bottom``/``input``/``output`` line removed, a number replaced by a
  hostile one (0, -1, 2^31, 2^40, 2^63), the text truncated; binary nets with bytes
  flipped, spliced in or cut off. The random choices come from one seeded generator, so
  a seed names the same cases on every machine.
- ``hostile_net_cases``: crafted nets: 200 levels of nested ``If`` nets (text and binary),
  int64-overflowing, zero and negative dimensions, a 20k-op chain, a Sum of 20k inputs,
  cycles and self-loops, garbage bytes, empty files, bad ``value_info.json`` and ``.npz``.
- ``bad_option_cases`` and ``bad_profile_cases``: option values and profile JSON that
  make no sense (negative sizes, NaN, truncated JSON, output paths that cannot be written).
- ``document_cases``: every kind of JSON document placer reads (device, machine and
  cluster profiles, cluster manifests, run records, plan documents, value_info.json,
  collectives measurements), each valid, unreadable in every way a file can be (nested
  100000 deep, truncated, empty, not UTF-8, NaN, 1e400, a 5000-digit integer, a folder
  in its place) and with each of its fields in turn given a wrong value.

``CliRunner`` runs each case in a worker process (so a hard crash cannot take the caller
down) under an address-space cap (``RLIMIT_AS``) and a time cap, and sorts the result:

======== ==============================================================================
ok       exit 0
refused  exit 2, exactly one line on stderr starting ``placer: error:``, under 300
         characters, no traceback
usage    argparse rejected the command line (exit 2, one line ``placer CMD: error: ...``)
-------- ------------------------------------------------------------------------------
messy    exit 2 but stderr is not that one line
wrote-on-failure exit 2, but the case's folder holds a new or changed file (a failed
         command writes nothing)
traceback an exception escaped ``main``
exit-N   any other exit status
timeout  the case ran past its time cap (the traceback shows where it was)
crash    the worker died (a signal, or the kernel's OOM killer)
======== ==============================================================================

The first three are the contract; the rest are failures. ``tests/test_fuzz.py`` runs a
small deterministic share in the suite, ``bench/fuzz.py`` a larger one.
"""
from __future__ import annotations

import base64
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "nets"
SEED = 20250607
ACCEPTED = ("ok", "refused", "usage")
MAX_LINE = 300  # characters of the one error line, its file paths included
STARTUP_S = 120.0  # importing placer and its commands in a fresh worker, on a busy host

# Caffe2 TensorProto.DataType FLOAT, and dimensions that overflow int64 once multiplied.
FLOAT = 1
HUGE_DIM = 2 ** 40


@dataclass
class Case:
    """One command line and the files it reads (written into the case's own folder)."""

    name: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Outcome:
    case: Case
    kind: str
    seconds: float
    rc: int | None = None
    stderr: str = ""
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.kind in ACCEPTED


# ---------------------------------------------------------------- small nets written as text

def relu_chain(n: int) -> str:
    ops = "".join(f'op {{ type: "Relu" input: "b{i}" output: "b{i + 1}" }}\n' for i in range(n))
    return f'name: "chain"\nexternal_input: "b0"\n{ops}external_output: "b{n}"\n'


def wide_sum(n: int) -> str:
    inputs = "".join(f'external_input: "x{i}"\n' for i in range(n))
    names = " ".join(f'input: "x{i}"' for i in range(n))
    return f'name: "wide"\n{inputs}op {{ type: "Sum" {names} output: "y" }}\nexternal_output: "y"\n'


def nested_if(depth: int) -> str:
    """``depth`` levels of If ops, each holding the next level in its then_net."""
    body = 'op { type: "Relu" input: "x" output: "y" }'
    for level in range(depth):
        body = (f'op {{ type: "If" input: "c" input: "x" output: "y" arg {{ name: "then_net" '
                f'n {{ name: "level{level}" {body} }} }} }}')
    return f'name: "deep"\nexternal_input: "c"\nexternal_input: "x"\n{body}\nexternal_output: "y"\n'


def text_to_binary(text: str) -> bytes:
    from google.protobuf import text_format

    from placer.formats import caffe2_pb as pb
    net = pb.NetDef()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))  # protobuf's text parser recurses per level
    try:
        text_format.Parse(text, net)
    finally:
        sys.setrecursionlimit(limit)
    return net.SerializeToString()


FC_NET = ('name: "mlp"\nop { type: "FC" input: "data" input: "w" input: "b" output: "fc" }\n'
          'op { type: "Relu" input: "fc" output: "y" }\n'
          'external_input: "data"\nexternal_input: "w"\nexternal_input: "b"\nexternal_output: "y"\n')


def fc_init(rows: int, cols: int) -> str:
    return (f'op {{ type: "ConstantFill" output: "w" arg {{ name: "shape" ints: {rows} ints: {cols} }} }}\n'
            f'op {{ type: "ConstantFill" output: "b" arg {{ name: "shape" ints: {rows} }} }}\n')


def caffe_input_net(dims: list[int], form: str = "layer") -> str:
    """A one-layer Caffe net (ReLU) whose input shape is ``dims``, in one of the forms
    a prototxt gives it."""
    dim_text = " ".join(f"dim: {d}" for d in dims)
    relu = 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
    if form == "input_dim":
        return 'input: "data"\n' + "".join(f"input_dim: {d}\n" for d in dims) + relu
    if form == "input_shape":
        return f'input: "data"\ninput_shape {{ {dim_text} }}\n' + relu
    return (f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dim_text} }} }} }}\n'
            + relu)


def npy_header_only(shape: tuple, dtype: str = "<f4") -> bytes:
    """An .npy file whose header claims ``shape`` but which holds no data."""
    header = repr({"descr": dtype, "fortran_order": False, "shape": tuple(shape)}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def npz(members: dict[str, bytes]) -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name + ".npy", data)
    return buf.getvalue()


# ---------------------------------------------------------------- crafted cases

def hostile_net_cases(scale: int = 20000) -> list[Case]:
    """Crafted nets; ``scale`` is the op count of the long chain and the wide Sum."""
    cases: list[Case] = []
    add = cases.append
    deep = nested_if(200)
    add(Case("nested-if-200-text", ["inspect", "deep.pbtxt"], {"deep.pbtxt": deep.encode()}))
    add(Case("nested-if-200-binary", ["inspect", "deep.pb"], {"deep.pb": text_to_binary(deep)}))
    add(Case("nested-if-2000-text", ["inspect", "deep.pbtxt"], {"deep.pbtxt": nested_if(2000).encode()}))
    add(Case("nested-if-20-plan", ["plan", "deep.pbtxt", "--input", "x=2,3", "--input", "c=1",
                                  "--input", "y=2,3", "-o", "placed.pbtxt"],
             {"deep.pbtxt": nested_if(20).encode()}))
    add(Case("nested-braces-prototxt", ["inspect", "deep.prototxt"],
             {"deep.prototxt": ("layer { name: \"a\" type: \"ReLU\" " + "zzz { " * 5000
                                + "}" * 5000 + " }\n").encode()}))
    add(Case("nested-json-profile", ["plan", "mlp.pbtxt", "--cpu-profile", "p.json"],
             {"mlp.pbtxt": FC_NET.encode(), "p.json": b"[" * 100000 + b"]" * 100000}))

    big = ["--input", f"data={HUGE_DIM},{HUGE_DIM}"]
    for cmd in ("inspect", "plan", "run", "profile"):
        extra = {"run": ["--quiet"], "profile": ["-o", "prof.json", "--quiet"], "plan": []}.get(cmd, [])
        add(Case(f"int64-overflow-input-{cmd}", [cmd, "mlp.pbtxt", "--init-net", "init.pbtxt", *big, *extra],
                 {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, HUGE_DIM).encode()}))
        add(Case(f"int64-overflow-params-{cmd}",
                 [cmd, "mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=4,8", *extra],
                 {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(HUGE_DIM, 8).encode()}))
        add(Case(f"huge-input-{cmd}", [cmd, "mlp.pbtxt", "--init-net", "init.pbtxt",
                                       "--input", "data=10000000000,100", *extra],
                 {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 100).encode()}))
    add(Case("huge-input-random-inputs", ["run", "mlp.pbtxt", "--init-net", "init.pbtxt", "--input",
                                          "data=10000000000,100", "--random-inputs", "3", "--quiet"],
             {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 100).encode()}))
    for dims, tag in (([2 ** 40, 2 ** 40], "2^40x2^40"), ([2 ** 62, 4], "2^62x4"), ([0, 3, 4, 4], "zero"),
                      ([-1, 3, 4, 4], "negative"), ([2 ** 63 - 1], "int64-max")):
        for form in ("layer", "input_dim", "input_shape"):
            for cmd in (["convert", "net.prototxt", "-o", "out"], ["inspect", "net.prototxt"],
                        ["run", "net.prototxt", "--quiet"]):
                add(Case(f"caffe-{form}-{tag}-{cmd[0]}", cmd,
                         {"net.prototxt": caffe_input_net(dims, form).encode()}))
    for spec in ("0,8", "4,0", "1,-8"):
        add(Case(f"zero-or-negative-input-{spec}", ["run", "mlp.pbtxt", "--init-net", "init.pbtxt",
                                                    "--input", f"data={spec}", "--quiet"],
                 {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 8).encode()}))
    add(Case("negative-fill-shape", ["run", "mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=4,8",
                                     "--quiet"],
             {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(-4, 8).encode()}))
    add(Case("zero-fill-shape-plan", ["plan", "mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=0,0"],
             {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(0, 0).encode()}))

    chain = relu_chain(scale)
    add(Case(f"chain-{scale}-plan", ["plan", "chain.pbtxt", "--input", "b0=2,2", "--time-limit", "1",
                                      "-o", "placed.pbtxt"], {"chain.pbtxt": chain.encode()}))
    add(Case(f"chain-{scale}-run", ["run", "chain.pb", "--input", "b0=2,2", "--quiet"],
             {"chain.pb": text_to_binary(chain)}))
    wide = wide_sum(scale)
    shapes = json.dumps({f"x{i}": [FLOAT, [2]] for i in range(scale)}).encode()
    add(Case(f"sum-{scale}-inputs-plan", ["plan", "wide.pb", "--time-limit", "1"],
             {"wide.pb": text_to_binary(wide), "wide.value_info.json": shapes}))
    add(Case(f"sum-{scale}-inputs-run", ["run", "wide.pb", "--quiet"],
             {"wide.pb": text_to_binary(wide), "wide.value_info.json": shapes}))
    add(Case(f"sum-{scale}-inputs-inspect", ["inspect", "wide.pbtxt"], {"wide.pbtxt": wide.encode()}))

    cycle = ('op { type: "Relu" input: "b" output: "a" }\nop { type: "Relu" input: "a" output: "b" }\n'
             'external_input: "x"\n')
    add(Case("cycle", ["plan", "cycle.pbtxt"], {"cycle.pbtxt": cycle.encode()}))
    add(Case("self-loop", ["plan", "loop.pbtxt", "--input", "a=2"],
             {"loop.pbtxt": b'op { type: "Relu" input: "a" output: "a" }\nexternal_output: "a"\n'}))
    add(Case("self-loop-unfed", ["inspect", "loop.pbtxt"],
             {"loop.pbtxt": b'op { type: "Add" input: "a" input: "q" output: "a" }\nexternal_input: "q"\n'}))
    add(Case("caffe-layer-cycle", ["convert", "c.prototxt", "-o", "out"],
             {"c.prototxt": (caffe_input_net([1, 2]) +
                             'layer { name: "s" type: "ReLU" bottom: "t" top: "u" }\n'
                             'layer { name: "t" type: "ReLU" bottom: "u" top: "t" }\n').encode()}))

    cases += lost_wiring_cases()
    lenet = CORPUS / "caffe" / "mnist_lenet.prototxt"
    if lenet.is_file():  # activations of 1e14 bytes: costs far beyond anything the planner scaled for
        huge = lenet.read_bytes().replace(b"dim: 28 dim: 28", b"dim: 2147483648 dim: 28")
        add(Case("caffe-huge-activations-plan", ["plan", "lenet.prototxt", "--time-limit", "1"],
                 {"lenet.prototxt": huge}))

    rng = random.Random(SEED)
    garbage = bytes(rng.randrange(256) for _ in range(4096))
    printable = "".join(rng.choice("{}[]:;\"'#<>abc xyz0123456789\n\t-.") for _ in range(4096)).encode()
    for name in ("g.pb", "g.pbtxt", "g.prototxt"):
        add(Case(f"garbage-bytes-{name}", ["inspect", name], {name: garbage}))
        add(Case(f"garbage-text-{name}", ["inspect", name], {name: printable}))
        add(Case(f"empty-{name}", ["inspect", name], {name: b""}))
        add(Case(f"blank-{name}", ["inspect", name], {name: b"\n \n\t\n"}))
        add(Case(f"nul-bytes-{name}", ["inspect", name], {name: b"\x00" * 100}))
    add(Case("empty-prototxt-convert", ["convert", "e.prototxt", "-o", "out"], {"e.prototxt": b""}))
    add(Case("garbage-convert", ["convert", "g.prototxt", "-o", "out"], {"g.prototxt": garbage}))
    add(Case("utf16-net", ["inspect", "u.pbtxt"], {"u.pbtxt": FC_NET.encode("utf-16")}))
    not_utf8 = text_to_binary(FC_NET).replace(b"Relu", b"R\xfflu")  # protobuf hands back bytes
    add(Case("op-type-not-utf8", ["inspect", "n.pb", "--init-net", "init.pbtxt"],
             {"n.pb": not_utf8, "init.pbtxt": fc_init(4, 8).encode()}))
    add(Case("garbage-init-net", ["inspect", "mlp.pbtxt", "--init-net", "init.pb"],
             {"mlp.pbtxt": FC_NET.encode(), "init.pb": garbage}))
    add(Case("garbage-weights", ["convert", "n.prototxt", "--weights", "w.caffemodel", "-o", "out"],
             {"n.prototxt": caffe_input_net([1, 2]).encode(), "w.caffemodel": garbage}))

    for tag, text in (("list", b'[1, [1, 2]]'), ("negative", b'{"data": [1, [-4, 8]]}'),
                      ("dtype", b'{"data": [99, [4, 8]]}'), ("nan", b'{"data": [1, [NaN, 8]]}'),
                      ("huge", b'{"data": [1, [1e300, 8]]}'), ("shape-string", b'{"data": [1, "4,8"]}'),
                      ("truncated", b'{"data": [1, [4,'), ("deep", b"[" * 50000 + b"]" * 50000),
                      ("bool-dims", b'{"data": [1, [true, 8]]}'), ("float-dims", b'{"data": [1, [4.5, 8]]}')):
        add(Case(f"value-info-{tag}", ["run", "mlp.pbtxt", "--init-net", "init.pbtxt", "--quiet"],
                 {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 8).encode(), "value_info.json": text}))

    for tag, data in (("garbage", garbage), ("header-claims-4TiB", npz({"data": npy_header_only((2 ** 40, 1))})),
                      ("pickled-object", npz({"data": npy_header_only((2,), "|O")})),
                      ("wrong-key", npz({"other": npy_header_only((0,))}))):
        add(Case(f"npz-{tag}", ["run", "mlp.pbtxt", "--init-net", "init.pbtxt", "--inputs", "in.npz", "--quiet"],
                 {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 8).encode(), "in.npz": data}))
    return cases


def lost_wiring_cases() -> list[Case]:
    """Corpus prototxts with one layer's `top:` or `bottom:` line removed: the BatchNorm /
    Scale pair of ResNet-50 (the fold looks at both), LeNet V1's InnerProduct, and others."""
    cases = []
    for name, layer, field_ in (("resnet50_ResNet-50-deploy", "bn_conv1", "top"),
                                ("resnet50_ResNet-50-deploy", "scale_conv1", "bottom"),
                                ("resnet50_ResNet-50-deploy", "scale_conv1", "top"),
                                ("v1_mnist_lenet_train_test", "ip1", "bottom"),
                                ("v1_mnist_lenet_train_test", "ip2", "top"),
                                ("mnist_lenet", "conv1", "top"), ("mnist_lenet", "prob", "bottom"),
                                ("bvlc_alexnet_train_val", "loss", "top"),
                                ("ssd300_vgg_voc0712_deploy", "conv4_3_norm_mbox_priorbox", "bottom")):
        path = CORPUS / "caffe" / f"{name}.prototxt"
        if not path.is_file():
            continue
        text = drop_wiring_line(path.read_text(), layer, field_)
        for cmd in (["convert", "net.prototxt", "-o", "out"], ["inspect", "net.prototxt"]):
            cases.append(Case(f"lost-{field_}-{name}-{layer}-{cmd[0]}", cmd, {"net.prototxt": text.encode()}))
    return cases


def drop_wiring_line(text: str, layer: str, field_: str) -> str:
    """``text`` without the first ``field_:`` line of the layer named ``layer`` (the block
    from its ``layer {`` / ``layers {`` line to the next one)."""
    lines = text.split("\n")
    opens = [i for i, line in enumerate(lines) if re.match(r"\s*layers?\s*\{", line)] + [len(lines)]
    named = next(i for i, line in enumerate(lines) if re.search(rf'\bname:\s*"{re.escape(layer)}"', line))
    start = max(i for i in opens if i <= named)
    end = min(i for i in opens if i > named)
    for i in range(start, end):
        if re.match(rf"\s*{field_}\s*:", lines[i]):
            del lines[i]
            return "\n".join(lines)
    raise ValueError(f"layer {layer} has no {field_} line")


def bad_option_cases() -> list[Case]:
    files = {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 8).encode(), "in.txt": b"x"}
    net = ["mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=2,8"]
    plan_opts = [["--gpu-mem", "-5"], ["--gpu-mem", "0"], ["--gpu-mem", "1e400"], ["--gpu-mem", "nan"],
                 ["--gpu-mem", "16XB"], ["--gpu-reserve", "2"], ["--gpu-reserve", "-1%"],
                 ["--gpu-reserve", "nan"], ["--gpu-reserve", "100%"], ["--pin", "garbage"], ["--pin", "=cpu"],
                 ["--pin", "fc*=tpu"], ["--pin", "[=gpu"], ["--time-limit", "-1"], ["--time-limit", "nan"],
                 ["--time-limit", "inf"], ["--unknown-op-cost", "-1"], ["--unknown-op-cost", "1e309"],
                 ["-o", "mlp.pbtxt"], ["--init-out", "init.pbtxt"], ["-o", "in.txt/sub/placed.pbtxt"],
                 ["--plan-out", "/proc/placer-fuzz/plan.json"], ["-o", "."], ["--plan-out", "new/dir/plan.json"],
                 ["--report", "r.html", "--trace", "r.html"], ["--method", "nope"], ["--init-out", "x.pbtxt"],
                 ["--gpu-profile", "no-such-profile"], ["--cpu-profile", "in.txt"], ["--cpu-profile", "."]]
    run_opts = [["--iterations", "0"], ["--iterations", "-1"], ["--iterations", "x"], ["--warmup", "-1"],
                ["--threads", "0"], ["--threads", "-3"], ["--random-inputs", "-1"], ["--seed", "-1"],
                ["--seed", str(2 ** 70)], ["--random-inputs", str(2 ** 70)], ["--outputs", "mlp.pbtxt"],
                ["--record", "init.pbtxt"], ["--outputs", "in.txt/o.npz"], ["--record", "."],
                ["--trace", "/proc/placer-fuzz/t.json"], ["--inputs", "nope.npz"], ["--inputs", "in.txt"],
                ["--inputs", "."]]
    input_specs = ["data", "data=", "=1,2", "data=a,b", "data=1,,2", "data=1,2:notadtype", "data=1,2:object",
                   "data=1,2:str", "data=1,2:V8", "data=1,2:void", "data=99999999999999999999999999,1",
                   "data=1.5,2", "data=-1,8", "data=1 2", "data=1,2:float32:int8", "data=2,8:bool",
                   "data=2,8:complex64", "data=2,8:datetime64", "data=2,8:U3", "data=2,8:float16",
                   "data==2,8", "nothere=1"]
    cases = [Case(f"plan {' '.join(o)}", ["plan", *net, *o], files) for o in plan_opts]
    cases += [Case(f"run {' '.join(o)}", ["run", *net, "--quiet", *o], files) for o in run_opts]
    for spec in input_specs:
        for cmd in ("inspect", "run", "plan"):
            cases.append(Case(f"{cmd} --input {spec}", [cmd, "mlp.pbtxt", "--init-net", "init.pbtxt",
                                                        "--input", spec] + (["--quiet"] if cmd == "run" else []),
                              files))
    caffe = {"n.prototxt": caffe_input_net([1, 2]).encode(), "in.txt": b"x"}
    for o in (["-o", "n.prototxt"], ["-o", "in.txt"], ["-o", "in.txt/sub"], ["-o", "/proc/placer-fuzz"],
              ["-o", "out", "--input", "nothere=1,2"], ["-o", "out", "--input", "data=garbage"],
              ["-o", "out", "--weights", "n.prototxt"], ["-o", "out", "--weights", "nope.caffemodel"],
              ["-o", "out", "--input", "data=0,2"], ["-o", "out", "--phase", "train"], ["-o", "."]):
        cases.append(Case(f"convert {' '.join(o)}", ["convert", "n.prototxt", *o], caffe))
    for o in (["--repeats", "0"], ["--warmup", "-1"], ["--budget", "nan"], ["--budget", "-1"], ["--device", "tpu"],
              ["--device", "cuda:x"], ["-o", "mlp.pbtxt"], ["-o", "in.txt"]):
        out = [] if "-o" in o else ["-o", "p.json"]
        cases.append(Case(f"profile {' '.join(o)}", ["profile", *net, "--quiet", *out, *o], files))
    return cases


def _profile_doc() -> dict:
    src = ROOT / "profiles" / "host-ci-2core.json"
    return json.loads(src.read_text())


def bad_profile_cases() -> list[Case]:
    """Profile JSON that is truncated, of the wrong types, NaN, negative or absurd."""
    good = _profile_doc()
    text = json.dumps(good)
    docs: dict[str, bytes] = {
        "truncated": text[: len(text) // 2].encode(), "empty": b"", "array": b"[]", "string": b'"cpu"',
        "null": b"null", "binary": bytes(range(256)), "deep": b"[" * 100000 + b"]" * 100000,
        "huge-int": text.replace('"schema_version": 1', '"schema_version": ' + "9" * 5000).encode(),
    }
    dev = good["devices"][0]

    def variant(tag: str, path: tuple, value) -> None:
        doc = json.loads(text)
        node = doc
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
        docs[tag] = json.dumps(doc, allow_nan=True).encode()

    for key in ("memory_bandwidth_bytes_per_s", "memory_capacity_bytes", "launch_overhead_s"):
        for tag, value in (("negative", -1.0), ("nan", float("nan")), ("inf", float("inf")),
                           ("string", "fast"), ("null", None), ("huge-int", 10 ** 400), ("list", [1]),
                           ("missing", _DELETE)):
            variant(f"{key}-{tag}", ("devices", 0, key), value)
    variant("peak-flops-nan", ("devices", 0, "peak_flops"), {"float32": float("nan")})
    variant("peak-flops-list", ("devices", 0, "peak_flops"), [1e12])
    variant("peak-flops-empty", ("devices", 0, "peak_flops"), {})
    variant("devices-empty", ("devices",), [])
    variant("devices-object", ("devices",), {"cpu": dev})
    variant("device-string", ("devices", 0), "cpu")
    variant("kind-gpu", ("devices", 0, "kind"), "tpu")
    variant("version", ("schema_version",), 999)
    variant("version-float", ("schema_version",), 1.0)
    variant("source-missing", ("devices", 0, "source"), _DELETE)
    variant("ops-garbage", ("devices", 0, "ops"), [{"type": "FC", "inputs": [{"shape": [-1], "dtype": "f"}]}])
    variant("ops-bad-dtype", ("devices", 0, "ops"),
            [{"type": "FC", "inputs": [{"shape": [2, 2], "dtype": "nonsense"}], "samples": 3,
              "median_s": 1e-3, "iqr_s": 0}])
    variant("ops-huge-shape", ("devices", 0, "ops"),
            [{"type": "Relu", "inputs": [{"shape": [2 ** 62, 2 ** 62], "dtype": "float32"}], "samples": 3,
              "median_s": 1e-3, "iqr_s": 0}])
    variant("fits-nan", ("devices", 0, "fits"), {"FC": {"overhead_s": float("nan")}})
    variant("fits-list", ("devices", 0, "fits"), [1])
    variant("link-negative", ("devices", 0, "link"),
            {d: {m: {"latency_s": 1e-6, "bytes_per_s": -1.0} for m in ("pinned", "pageable")}
             for d in ("h2d", "d2h")})
    variant("link-points-garbage", ("devices", 0, "link"),
            {d: {m: {"latency_s": 1e-6, "bytes_per_s": 1e9, "points": [[1, "x"], None]}
                 for m in ("pinned", "pageable")} for d in ("h2d", "d2h")})
    files = {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 8).encode()}
    cases = [Case(f"report-json {tag}", ["report", "plan.json", "-o", "r.html"], {"plan.json": docs[tag]})
             for tag in ("truncated", "empty", "array", "binary", "deep", "huge-int")]
    for tag, data in docs.items():
        for option in ("--cpu-profile", "--gpu-profile", "--profile"):
            cases.append(Case(f"profile-json {tag} {option}",
                              ["plan", "mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=2,8",
                               option, "p.json"], {**files, "p.json": data}))
        cases.append(Case(f"profile-json {tag} merged by placer profile",
                          ["profile", "mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=2,8",
                           "--quiet", "-o", "p.json", "--repeats", "1", "--budget", "0.01"],
                          {**files, "p.json": data}))
    return cases


_DELETE = object()


# ---------------------------------------------------------------- every JSON document placer reads

# Values put in place of one field of a valid document, in turn: NaN, Infinity and 1e400
# are written as such (not JSON numbers a strict parser reads; 1e400 overflows a float),
# 10**400 is a JSON integer no float holds.
_NAN, _INF, _OVERFLOW = "@nan@", "@inf@", "@1e400@"
FIELD_VALUES = (("nan", _NAN), ("string", "x"), ("huge", 10 ** 400), ("list", [1, 2]), ("negative", -1),
                ("overflow", _OVERFLOW), ("null", None), ("object", {"a": 1}), ("bool", True), ("missing", _DELETE),
                ("inf", _INF), ("zero", 0), ("deep", [[[[[[[[[[0]]]]]]]]]]))


def hostile_json_text(doc) -> dict[str, bytes]:
    """The same document made unreadable in every way a file can be (besides wrong fields)."""
    text = json.dumps(doc)
    number = re.search(r"(?<![\w.\"])\d+(\.\d+)?(e[+-]?\d+)?(?![\w.\"])", text)
    at = slice(*number.span()) if number else slice(len(text) - 1, len(text) - 1)

    def put(value: str) -> bytes:
        return (text[:at.start] + value + text[at.stop:]).encode()
    return {
        "deep-lists": b"[" * 100000 + b"]" * 100000, "deep-objects": b'{"a": ' * 50000 + b"1" + b"}" * 50000,
        "deep-in-a-field": text.replace("{", '{"zz": ' + "[" * 5000 + "]" * 5000 + ", ", 1).encode(),
        "truncated": text[: len(text) // 2].encode(), "empty": b"", "blank": b" \n\t\n",
        "not-utf8": text.encode()[:10] + b"\xff\xfe" + text.encode()[10:], "utf16": text.encode("utf-16"),
        "binary": bytes(range(256)) * 4, "nan-literal": put("NaN"), "infinity-literal": put("-Infinity"),
        "1e400": put("1e400"), "5000-digit-int": put("9" * 5000), "10**400": put(str(10 ** 400)),
        "top-list": b"[]", "top-string": b'"x"', "top-null": b"null", "top-number": b"3",
        "trailing-garbage": (text + " }").encode(), "two-documents": (text + text).encode(),
        "bom": b"\xef\xbb\xbf" + text.encode(),
    }


def field_paths(doc, depth: int = 4, at: tuple = ()) -> list[tuple]:
    """Every field of ``doc`` to ``depth`` levels; of a list, and of an object whose
    values are all alike records (a plan's ``baselines``, ``memory``), the first item only."""
    out = []
    if isinstance(doc, dict):
        records = len(doc) > 1 and all(isinstance(v, (dict, list)) for v in doc.values())
        items = list(doc.items())[:1] if records else doc.items()
    else:
        items = enumerate(doc[:1]) if isinstance(doc, list) else ()
    for key, value in items:
        out.append((*at, key))
        if len(at) + 1 < depth:
            out += field_paths(value, depth, (*at, key))
    return out


def with_field(doc, path: tuple, value) -> bytes:
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    text = json.dumps(doc)
    for marker, literal in ((_NAN, "NaN"), (_INF, "Infinity"), (_OVERFLOW, "1e400")):
        text = text.replace(json.dumps(marker), literal)
    return text.encode()


def wrong_field_docs(doc, depth: int = 4, per_field: int = 2) -> dict[str, bytes]:
    """``per_field`` documents per field of ``doc``, each with that field replaced by a
    hostile value (``FIELD_VALUES`` taken in turn, so that every kind meets many fields)."""
    docs = {}
    for i, path in enumerate(field_paths(doc, depth)):
        for j in range(per_field):
            tag, value = FIELD_VALUES[(i * per_field + j) % len(FIELD_VALUES)]
            docs[f"{'.'.join(map(str, path))}={tag}"] = with_field(doc, path, value)
    return docs


def valid_machine_doc() -> dict:
    return {"schema_version": 1, "kind": "machine", "name": "fuzz-2gpu", "description": "two T4s",
            "host": "host-ci-2core", "gpus": [{"profile": "t4-pcie3", "count": 2}], "peer_default": "staged",
            "peer_links": [{"gpus": [0, 1], "kind": "nvlink2", "count": 2}], "pcie_switches": [[0, 1]],
            "peer_curves": [{"src": 0, "dst": 1, "p2p": True, "latency_s": 1e-5, "bytes_per_s": 4e10,
                             "points": [[1024, 2e-5], [1048576, 5e-5]]}],
            "sources": {"topology": "made up for the fuzz cases"}}


def valid_cluster_doc() -> dict:
    return {"schema_version": 1, "kind": "cluster", "name": "fuzz-2hosts", "description": "two boxes",
            "hosts": [{"name": "a", "machine": "2x-t4-pcie3", "memory_bytes": 8e9},
                      {"name": "b", "machine": "2x-t4-pcie3", "cpu": "host-ci-2core"}],
            "network": {"kind": "10gbe", "bytes_per_s": 1.25e9, "latency_s": 5e-5, "gpudirect_rdma": False,
                        "source": "10 GbE"}, "sources": {"network": "made up for the fuzz cases"}}


def valid_manifest_doc() -> dict:
    """A manifest as ``placer plan --cluster -o`` writes it (its worker nets are not there:
    a run would stop at them, before starting Ray)."""
    worker = {"rank": 0, "host": "a", "devices": ["a/cpu"], "gpus": 0, "net": "workers/a.pbtxt",
              "init_net": "workers/a_init.pbtxt", "inputs": ["data"], "outputs": ["y"], "predicted_s": 1e-3}
    return {"schema": "placer.cluster_manifest", "schema_version": 1, "net": "mlp",
            "cluster": {"name": "c", "description": "d", "hosts": ["a", "b"], "network": {"kind": "10gbe"}},
            "world": {"size": 2, "blob": "world", "engine": "GLOO"},
            "inputs": {"data": {"shape": [2, 8], "dtype": "float32"}}, "outputs": ["y"],
            "placed_net": "placed.pbtxt", "placed_init_net": "placed_init.pbtxt",
            "one_process_net": "one_process.pbtxt", "one_process_init_net": "one_process_init.pbtxt",
            "one_process_gpus": 0, "predicted": {"serial_s": 1e-3, "makespan_s": 1e-3},
            "workers": [worker, {**worker, "rank": 1, "host": "b", "devices": ["b/cpu"],
                                 "net": "workers/b.pbtxt", "init_net": "workers/b_init.pbtxt"}],
            "messages": [{"tag": 0, "blob": "fc", "src": "a/cpu", "dst": "b/cpu", "bytes": 64}],
            "collectives": []}


def document_cases(per_field: int = 2) -> list[Case]:
    """Every kind of JSON document placer reads, made hostile (``hostile_json_text``, a
    folder in its place, and ``wrong_field_docs``), each through the command that reads it.
    Plans and run records get half the wrong fields: each one read renders a report (~3 s)."""
    from report_cases import four_gpu_plan, four_gpu_run
    net = {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 8).encode()}
    plan_argv = ["plan", "mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=2,8", "--time-limit", "1",
                 "--stability-draws", "0"]
    plan, run = four_gpu_plan(), four_gpu_run(four_gpu_plan())
    kinds = [  # (kind, valid document, its file name, argv, other files, fields checked)
        ("machine", valid_machine_doc(), "m.json", plan_argv + ["--machine", "m.json"], net, 4),
        ("cluster", valid_cluster_doc(), "c.json", plan_argv + ["--cluster", "c.json"], net, 4),
        ("device-profile", _profile_doc(), "p.json", plan_argv + ["--cpu-profile", "p.json"], net, 4),
        ("manifest", valid_manifest_doc(), "out/manifest.json", ["run", "out", "--ray", "--quiet"], {}, 3),
        ("run-record", run, "run.json", ["report", "plan.json", "--run", "run.json", "-o", "r.html"],
         {"plan.json": json.dumps(plan).encode()}, 3),
        ("plan", plan, "plan.json", ["report", "plan.json", "-o", "r.html", "--trace", "t.json"], {}, 4),
        ("value-info", {"data": [1, [2, 8]]}, "mlp.value_info.json", ["inspect", "mlp.pbtxt", "--init-net",
                                                                       "init.pbtxt"], net, 3),
        ("collectives", {"schema_version": 1, "kind": "collectives", "gpus": [0, 1], "gpu_names": ["x", "y"],
                         "nccl_version": 21803, "points": []}, "coll.json",
         ["profile", "--collectives", "-o", "coll.json", "--quiet"], {}, 0),
    ]
    cases = []
    for kind, doc, name, argv, files, depth in kinds:
        fields = max(1, per_field // 2) if argv[0] == "report" else per_field
        if len(field_paths(doc, depth)) <= 6:    # a small document meets every value in every field
            fields = len(FIELD_VALUES)
        bodies = {"valid": json.dumps(doc).encode(), **hostile_json_text(doc),
                  **wrong_field_docs(doc, depth, fields)}
        for tag, body in bodies.items():
            cases.append(Case(f"json {kind} {tag}", argv, {**files, name: body}))
        cases.append(Case(f"json {kind} folder", argv, {**files, name + "/": b""}))
    return cases


# ---------------------------------------------------------------- mutations of the corpus

_NUMBER = re.compile(rb"(?<![\w.])\d+(?![\w.])")
_WIRING = re.compile(rb"^\s*(top|bottom|input|output)\s*:", re.M)
HOSTILE_NUMBERS = (b"0", b"-1", b"2147483648", b"1099511627776", b"9223372036854775808", b"3")


def mutate_text(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    lines = data.split(b"\n")
    kind = rng.choice(["drop", "duplicate", "swap", "truncate", "wiring", "number", "number", "garble"])
    if kind == "drop" and len(lines) > 1:
        del lines[rng.randrange(len(lines))]
    elif kind == "duplicate":
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif kind == "swap" and len(lines) > 1:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "truncate":
        return kind, data[:rng.randrange(len(data) + 1)]
    elif kind == "wiring":
        spots = [i for i, line in enumerate(lines) if _WIRING.match(line)]
        if spots:
            del lines[rng.choice(spots)]
    elif kind == "number":
        spots = list(_NUMBER.finditer(data))
        if spots:
            m = rng.choice(spots)
            return kind, data[:m.start()] + rng.choice(HOSTILE_NUMBERS) + data[m.end():]
    elif kind == "garble":
        at = rng.randrange(len(data) + 1)
        junk = bytes(rng.choice(b'{}:"# \nabc1-') for _ in range(rng.randint(1, 6)))
        return kind, data[:at] + junk + data[at:]
    return kind, b"\n".join(lines)


def mutate_binary(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(["flip", "flip", "truncate", "splice", "zero"])
    buf = bytearray(data)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del buf[rng.randrange(len(buf) + 1):]
    elif kind == "splice":
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    else:
        at = rng.randrange(len(buf))
        buf[at:at + rng.randint(1, 32)] = bytes(min(32, len(buf) - at))
    return kind, bytes(buf)


def _init_partner(path: Path) -> Path | None:
    from placer.formats import find_init_net
    found = find_init_net(path)
    return Path(found) if found else None


def corpus_targets(corpus: Path = CORPUS) -> list[Path]:
    return sorted(p for sub in ("caffe", "caffe2") for p in (corpus / sub).glob("*")
                  if p.is_file() and p.suffix in (".prototxt", ".pbtxt", ".pb"))


def mutated_corpus_cases(count: int, seed: int = SEED, corpus: Path = CORPUS,
                         max_bytes: int = 120_000) -> list[Case]:
    """``count`` corpus nets with one to three mutations each, run through a command that
    reads them; a mutated init net is read beside its own predict net."""
    targets = [p for p in corpus_targets(corpus) if p.stat().st_size <= max_bytes]
    if not targets:
        return []
    predict_of = {init: p for p in targets if (init := _init_partner(p)) is not None}
    rng = random.Random(seed)
    cases = []
    for n in range(count):
        path = rng.choice(targets)
        data = path.read_bytes()
        textual = b"\x00" not in data[:4096] and _is_utf8(data)
        kinds = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            kind, data = (mutate_text if textual else mutate_binary)(data, rng) if data else ("empty", data)
            kinds.append(kind)
        name = f"m{n}{path.suffix}"
        cases.append(Case(f"mutated {path.name} ({'+'.join(kinds)}) #{n}",
                          _reader_argv(path, name, len(data) < 3000, predict_of, rng), {name: data}))
    return cases


def _reader_argv(path: Path, name: str, small: bool, predict_of: dict, rng: random.Random) -> list[str]:
    if path in predict_of and rng.random() < 0.5:  # the init net, beside its predict net
        return [rng.choice(["inspect", "plan"]), str(predict_of[path]), "--init-net", name]
    if path.suffix == ".prototxt":
        return rng.choice([["convert", name, "-o", "out"], ["inspect", name], ["plan", name, "--time-limit", "1"]]
                          + ([["run", name, "--quiet"]] if small else []))
    partner = _init_partner(path)
    init = ["--init-net", str(partner)] if partner else []
    return rng.choice([["inspect", name, *init], ["plan", name, *init, "--time-limit", "1"]]
                      + ([["run", name, *init, "--quiet"]] if small else []))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def all_cases(mutations: int, scale: int = 20000, seed: int = SEED) -> list[Case]:
    return (hostile_net_cases(scale) + bad_option_cases() + bad_profile_cases() + document_cases(per_field=4)
            + mutated_corpus_cases(mutations, seed))


# ---------------------------------------------------------------- the runner

class CliRunner:
    """Runs cases through ``placer.cli.main`` in a worker process, one at a time.

    The worker (this file run as a script) is started with an address-space cap, so an
    allocation past ``mem_cap_bytes`` fails inside it (numpy's MemoryError surfaces as a
    traceback) instead of exhausting the machine. A case that outlives ``time_cap_s``
    gets SIGALRM in the worker (its traceback says where it was); one that does not
    return within a few more seconds has its worker killed and restarted.
    """

    def __init__(self, workdir: Path, mem_cap_bytes: int = 2 << 30, time_cap_s: float = 20.0):
        self.workdir, self.mem_cap_bytes, self.time_cap_s = Path(workdir), mem_cap_bytes, time_cap_s
        self.proc: subprocess.Popen | None = None
        self.count = 0

    def __enter__(self) -> "CliRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def _start(self) -> subprocess.Popen:
        cap = self.mem_cap_bytes

        def limit() -> None:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            os.setsid()

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                preexec_fn=limit, cwd=str(self.workdir))

    def run(self, case: Case) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
            if self._read_line(STARTUP_S) is None:
                raise RuntimeError(f"the fuzz worker did not start within {STARTUP_S} s")
        self.count += 1
        folder = self.workdir / f"case{self.count}"
        request = {"argv": case.argv, "folder": str(folder), "alarm_s": self.time_cap_s,
                   "files": {k: base64.b64encode(v).decode() for k, v in case.files.items()}}
        start = time.perf_counter()
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._read_line(self.time_cap_s + 10)
        seconds = time.perf_counter() - start
        if line is None:
            kind, detail = self._dead()
            return Outcome(case, kind, seconds, detail=detail)
        reply = json.loads(line)
        return classify(case, reply, seconds)

    def _read_line(self, timeout_s: float) -> bytes | None:
        out = self.proc.stdout
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            return None
        line = out.readline()
        return line or None

    def _dead(self) -> tuple[str, str]:
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout", "the worker did not answer after SIGALRM; killed"
        return "crash", f"the worker died with status {proc.returncode}"


def classify(case: Case, reply: dict, seconds: float) -> Outcome:
    rc, err, tb = reply["rc"], reply["stderr"], reply["traceback"]
    if reply.get("timeout"):
        return Outcome(case, "timeout", seconds, rc, err, tb)
    if tb:
        return Outcome(case, "traceback", seconds, rc, err, tb)
    if rc == 0:
        return Outcome(case, "ok", seconds, rc, err)
    if rc == 2 and reply.get("written"):
        return Outcome(case, "wrote-on-failure", seconds, rc, err, f"left behind: {', '.join(reply['written'])}")
    if rc == 2 and reply.get("usage"):
        lines = err.splitlines()
        good = len(lines) == 1 and lines[0].startswith("placer") and ": error: " in lines[0] and len(lines[0]) < MAX_LINE
        return Outcome(case, "usage" if good else "messy", seconds, rc, err)
    if rc == 2:
        lines = err.splitlines()
        good = len(lines) == 1 and lines[0].startswith("placer: error: ") and err.endswith("\n") \
            and len(lines[0]) < MAX_LINE
        return Outcome(case, "refused" if good else "messy", seconds, rc, err)
    return Outcome(case, f"exit-{rc}", seconds, rc, err)


# ---------------------------------------------------------------- the worker side

def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) + ("/" if p.is_dir() else "") for p in folder.rglob("*")}


def _written(folder: Path, before: set[str], given: dict[str, bytes]) -> list[str]:
    """What the command left in its folder: new files and folders, and given files changed."""
    changed = [name for name, data in given.items()
               if not name.endswith("/") and (not (folder / name).is_file() or (folder / name).read_bytes() != data)]
    return sorted(_tree(folder) - before) + [f"{name} (changed)" for name in changed]


class CaseTimeout(BaseException):
    """Raised by SIGALRM in the worker: not an Exception, so no handler in placer eats it."""


def _serve() -> None:
    import contextlib
    import io
    import traceback
    import warnings

    reply_to = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # stray writes to fd 1 must not corrupt the replies

    def on_alarm(signum, frame):
        raise CaseTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    from placer.cli import COMMANDS, command_module, main
    for name in COMMANDS:  # every command module imported now, outside any case's time cap
        command_module(name)
    reply_to.write(json.dumps({"ready": True}) + "\n")
    reply_to.flush()
    for line in sys.stdin:
        request = json.loads(line)
        folder = Path(request["folder"])
        folder.mkdir(parents=True, exist_ok=True)
        given = {name: base64.b64decode(data) for name, data in request["files"].items()}
        for name, data in given.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            if name.endswith("/"):  # a folder where the command expects a file
                (folder / name).mkdir(exist_ok=True)
            else:
                (folder / name).write_bytes(data)
        before = _tree(folder)
        os.chdir(folder)
        out, err = io.StringIO(), io.StringIO()
        reply = {"rc": None, "traceback": "", "usage": False, "timeout": False}
        signal.setitimer(signal.ITIMER_REAL, request["alarm_s"])
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                reply["rc"] = main(request["argv"])
        except SystemExit as e:  # argparse rejected the command line
            reply["rc"], reply["usage"] = e.code, True
        except CaseTimeout:
            reply["timeout"] = True
            reply["traceback"] = traceback.format_exc()
        except BaseException:
            reply["traceback"] = traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        reply["stderr"] = err.getvalue()[-4000:]
        reply["written"] = _written(folder, before, given)
        reply_to.write(json.dumps(reply) + "\n")
        reply_to.flush()


if __name__ == "__main__":
    _serve()
