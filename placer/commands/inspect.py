"""`placer inspect`: every op of a net with its output shapes and cost features, and totals."""
from __future__ import annotations

import json
import sys
from collections import Counter

from placer.commands.common import add_net_arguments, load_typed_net
from placer.shapes import bounded_notes, missing_summary
from placer.types import TypedNet, display_name, shape_str
from placer.units import fmt_bytes

DESCRIPTION = """\
Load a net (Caffe2 NetDef text/binary with its init net, or Caffe prototxt), infer every
blob's shape and print one row per op: index, name (or first output), type, output shapes,
GFLOP, GMAC, bytes read and written, parameter bytes, and whether placer knows the op;
then totals (ops, unknown op types, parameter and activation bytes, GFLOP, GMAC). Sizes
print in binary units (KiB, MiB, GiB); --json gives the mb_* figures in 10^6 bytes.

Convention: one multiply-add is 1 MAC and 2 FLOPs; GMAC counts Conv/FC/MatMul-like work,
GFLOP all floating-point work.

Missing shapes: when some blob's shape cannot be known (a predict net without its init
net, an input the file does not size, the output of an op type placer does not know),
the table is still printed, with '?' where a figure is unknown, followed by the list of
missing blobs and the option that supplies each (--init-net INIT, --input NAME=...).
The command then exits with code 2 and says so on one line on stderr; a complete table
exits 0. A file that cannot be read as a net, or shapes that do not fit an op, print one
line on stderr and exit 2 without a table.

examples:
  placer inspect resnet50_predict_net.pbtxt --init-net resnet50_init_net.pb --input gpu_0/data=1,3,224,224
  placer inspect ResNet-50-deploy.prototxt --json
"""
MAC_CONVENTION = "1 MAC = one multiply-add = 2 FLOPs"
MB = 1e6
COLUMN_TITLES = {"gflop": "GFLOP", "gmac": "GMAC", "mb_read": "read",
                 "mb_written": "written", "param_mb": "params"}
SIZE_COLUMNS = ("mb_read", "mb_written", "param_mb")
G = 1e9


def add_arguments(parser) -> None:
    add_net_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the table and totals as JSON")


def run(args) -> int:
    typed = load_typed_net(args)
    rows = op_rows(typed)
    totals = net_totals(typed)
    if args.json:
        print(json.dumps({"net": str(typed.net.path), "ops": rows, "totals": totals,
                          "missing": list(typed.missing.values()),
                          "complete": not typed.missing}, indent=1))
    else:
        print(format_table(rows))
        print()
        print(format_totals(totals))
        for note in bounded_notes(typed.blobs):
            print(f"note: {note}")
        if typed.missing:
            print("\nmissing shapes:")
            for message in typed.missing.values():
                print(f"  {message}")
    if typed.missing:
        print(f"placer: error: {typed.net.path}: incomplete shapes: {missing_summary(typed)}",
              file=sys.stderr)
        return 2
    return 0


def op_rows(typed: TypedNet) -> list[dict]:
    """One dict per op; figures are None where they are unknown."""
    rows = []
    for op, f, outs in zip(typed.net.ops, typed.features, typed.op_outputs):
        known = op.index not in typed.unknown_ops
        have = f.known
        rows.append({
            "index": op.index, "op": display_name(op.name, op.outputs),
            "type": op.type, "outputs": shape_str(outs),
            "output_types": [None if t is None else {"shape": list(t.shape), "dtype": t.dtype,
                                                     **({"bound": t.bound} if t.bound else {})}
                             for t in outs],
            "gflop": f.flops / G if have else None, "gmac": f.macs / G if have else None,
            "mb_read": f.bytes_read / MB if have else None,
            "mb_written": f.bytes_written / MB if have else None,
            "param_mb": f.param_bytes / MB if have else None,
            "known": known,
        })
    return rows


def net_totals(typed: TypedNet) -> dict:
    net = typed.net
    unknown = Counter(net.ops[i].type for i in typed.unknown_ops)
    activation_bytes: dict[str, int] = {}  # one buffer per blob name, as big as it gets
    for op, outs in zip(net.ops, typed.op_outputs):
        for name, t in zip(op.outputs, outs):
            if t is not None and name not in net.params:
                activation_bytes[name] = max(activation_bytes.get(name, 0), t.nbytes)
    costed = [f for f in typed.features if f.known]
    return {
        "ops": len(net.ops),
        "unknown_op_types": dict(sorted(unknown.items())),
        "ops_without_cost": len(net.ops) - len(costed),
        "param_mb": sum(t.nbytes for t in net.params.values()) / MB,
        "activation_mb": sum(activation_bytes.values()) / MB,
        "blobs_without_shape": sum(1 for t in typed.blobs.values() if t is None),
        "gflop": sum(f.flops for f in costed) / G,
        "gmac": sum(f.macs for f in costed) / G,
        "convention": MAC_CONVENTION,
    }


def format_table(rows: list[dict]) -> str:
    import pandas as pd

    if not rows:
        return "(the net has no ops)"
    df = pd.DataFrame(rows).drop(columns="output_types").set_index("index")
    df["known"] = df["known"].map({True: "known", False: "UNKNOWN"})
    for column in COLUMN_TITLES:
        df[column] = [_size(x) if column in SIZE_COLUMNS else _figure(x) for x in df[column]]
    return df.rename(columns=COLUMN_TITLES).to_string(max_colwidth=48)


def _figure(x) -> str:
    if x is None:
        return "?"
    return f"{x:.4g}"


def _size(mb) -> str:
    return "?" if mb is None else fmt_bytes(mb * MB)


def format_totals(t: dict) -> str:
    unknown = ", ".join(f"{k} x{v}" for k, v in t["unknown_op_types"].items()) or "none"
    lines = [
        f"ops: {t['ops']}   unknown op types: {unknown}",
        f"parameters: {_size(t['param_mb'])}   activations: {_size(t['activation_mb'])}",
        f"total: {t['gflop']:.4g} GFLOP, {t['gmac']:.4g} GMAC ({t['convention']})",
    ]
    if t["ops_without_cost"]:
        lines.append(f"{t['ops_without_cost']} op(s) have no cost figures (unknown type or "
                     "unknown input shapes): totals leave them out")
    return "\n".join(lines)
