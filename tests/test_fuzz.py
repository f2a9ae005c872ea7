"""Hostile input through the command line ends in exit 0 or one clean line (exit 2).

Every case of ``tests/fuzz_cases.py`` (crafted hostile nets, bad options, bad profile
JSON, and a seeded sample of mutated corpus nets) runs through ``placer.cli.main`` in a
worker process under a 2 GiB address-space cap and a time cap per case; a traceback, a
multi-line error, a timeout or a dead worker fails the case. ``bench/fuzz.py`` runs the
same cases at full scale and many more mutations.
"""
from __future__ import annotations

import pytest

from fuzz_cases import (ACCEPTED, Case, CliRunner, Outcome, bad_option_cases, bad_profile_cases, classify,
                        document_cases, hostile_json_text, hostile_net_cases, mutated_corpus_cases)
from fuzz_onnx_cases import onnx_cases

SEED = 20250607
MUTATIONS = 150       # the suite's share; bench/fuzz.py runs thousands
SCALE = 2000          # ops of the long chain and inputs of the wide Sum (bench: 20k)
TIME_CAP_S = 30.0     # per case, on a busy 2-core host
MEM_CAP_BYTES = 2 << 30

CRAFTED = hostile_net_cases(SCALE) + bad_option_cases() + bad_profile_cases()
MUTATED = mutated_corpus_cases(MUTATIONS, SEED)
DOCUMENTS = document_cases()
DOCUMENT_KINDS = ("machine", "cluster", "device-profile", "manifest", "run-record", "plan", "value-info",
                  "collectives")
# Valid documents whose command cannot succeed here: a manifest's worker nets are left out
# (a run would start Ray), and measuring collectives needs CUDA GPUs.
REFUSED_WHEN_VALID = ("manifest", "collectives")


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    with CliRunner(tmp_path_factory.mktemp("fuzz"), MEM_CAP_BYTES, TIME_CAP_S) as r:
        yield r


def _contract(outcome: Outcome) -> None:
    assert outcome.kind in ACCEPTED, (
        f"{outcome.kind} after {outcome.seconds:.1f} s: placer {' '.join(outcome.case.argv)[:300]}\n"
        f"{outcome.detail or outcome.stderr}")


@pytest.mark.parametrize("case", CRAFTED, ids=lambda c: c.name)
def test_crafted_case(runner, case):
    _contract(runner.run(case))


@pytest.mark.parametrize("case", DOCUMENTS, ids=lambda c: c.name)
def test_json_document_case(runner, case):
    """Exit 0 or one line (exit 2), nothing written on failure; a valid document is read."""
    outcome = runner.run(case)
    _contract(outcome)
    kind, tag = case.name.split(" ", 2)[1:]
    if tag == "valid" and kind not in REFUSED_WHEN_VALID:
        assert outcome.kind == "ok", outcome.stderr
    if tag in hostile_json_text({}) or tag == "folder":
        assert outcome.kind == "refused", outcome.stderr


def test_every_document_kind_meets_every_hostile_form():
    tags = {}
    for c in DOCUMENTS:
        kind, tag = c.name.split(" ", 2)[1:]
        tags.setdefault(kind, set()).add(tag)
    assert set(tags) == set(DOCUMENT_KINDS)
    forms = set(hostile_json_text({})) | {"valid", "folder"}
    for kind, seen in tags.items():
        assert forms <= seen, (kind, forms - seen)
        wrong = {t.rsplit("=", 1)[1] for t in seen if "=" in t}
        assert {"nan", "overflow", "huge", "string", "missing", "null"} <= wrong, (kind, wrong)


@pytest.mark.corpus
@pytest.mark.parametrize("case", MUTATED, ids=lambda c: c.name)
def test_mutated_corpus_net(runner, case):
    _contract(runner.run(case))


@pytest.mark.corpus
def test_the_corpus_is_sampled(corpus):
    """The seed names the same mutations everywhere, and they reach every corpus format."""
    assert len(MUTATED) == MUTATIONS
    assert [c.name for c in mutated_corpus_cases(MUTATIONS, SEED)] == [c.name for c in MUTATED]
    suffixes = {name.rsplit(".", 1)[1] for c in MUTATED for name in c.files}
    assert suffixes == {"prototxt", "pbtxt", "pb"}
    kinds = {k for c in MUTATED for k in c.name.split("(")[1].split(")")[0].split("+")}
    assert {"drop", "swap", "truncate", "wiring", "number", "flip", "splice"} <= kinds
    assert any("--init-net" in c.argv and c.argv[c.argv.index("--init-net") + 1] in c.files for c in MUTATED)


def test_the_bugs_it_was_built_for_are_in_the_suite():
    names = {c.name for c in CRAFTED}
    for expected in ("nested-if-200-text", "nested-if-200-binary", "huge-input-run",
                     "huge-input-random-inputs", "cycle", "self-loop", f"sum-{SCALE}-inputs-run",
                     f"chain-{SCALE}-plan", "npz-header-claims-4TiB", "profile-json deep --cpu-profile"):
        assert expected in names, expected


@pytest.mark.corpus
def test_the_corpus_bugs_it_was_built_for_are_in_the_suite(corpus):
    names = {c.name for c in CRAFTED}
    for expected in ("lost-top-resnet50_ResNet-50-deploy-bn_conv1-convert",
                     "lost-bottom-resnet50_ResNet-50-deploy-scale_conv1-convert",
                     "lost-bottom-v1_mnist_lenet_train_test-ip1-convert", "caffe-huge-activations-plan"):
        assert expected in names, expected


# ---------------------------------------------------------------- the harness itself

def test_classify_sorts_replies():
    case = Case("x", ["inspect", "x"])
    reply = {"rc": 2, "stderr": "placer: error: x: no such file\n", "traceback": "", "usage": False}
    assert classify(case, reply, 0.1).kind == "refused"
    assert classify(case, {**reply, "stderr": "placer: error: a\nb\n"}, 0.1).kind == "messy"
    assert classify(case, {**reply, "stderr": "warning: x\n"}, 0.1).kind == "messy"
    assert classify(case, {**reply, "rc": None, "traceback": "Traceback ..."}, 0.1).kind == "traceback"
    assert classify(case, {**reply, "rc": 0, "stderr": ""}, 0.1).kind == "ok"
    assert classify(case, {**reply, "rc": 1}, 0.1).kind == "exit-1"
    assert classify(case, {**reply, "usage": True, "stderr": "placer plan: error: argument --x\n"}, 0.1).kind == "usage"
    assert classify(case, {**reply, "usage": True, "stderr": "usage: ...\nplacer: error: ...\n"}, 0.1).kind == "messy"
    assert classify(case, {**reply, "written": ["out.pbtxt"]}, 0.1).kind == "wrote-on-failure"
    assert classify(case, {**reply, "rc": 0, "written": ["out.pbtxt"]}, 0.1).kind == "ok"


def test_the_runner_sees_what_a_failed_case_left(tmp_path):
    """A folder where a file is expected is made as one; a failed command that leaves a
    file behind, or changes a given one, is a failure of its own."""
    from fuzz_cases import FC_NET
    with CliRunner(tmp_path, MEM_CAP_BYTES, TIME_CAP_S) as r:
        folder = r.run(Case("folder", ["inspect", "n.pbtxt"], {"n.pbtxt/": b""}))
        assert folder.kind == "refused" and "n.pbtxt" in folder.stderr
        wrote = r.run(Case("wrote", ["convert", "n.prototxt", "-o", "out"], {"n.prototxt": b"garbage {"}))
        assert wrote.kind == "refused", wrote.detail
        ok = r.run(Case("ok", ["plan", "n.pbtxt", "--input", "data=2,8", "--input", "w=4,8", "--input", "b=4",
                                "--plan-out", "plan.json", "--stability-draws", "0"], {"n.pbtxt": FC_NET.encode()}))
        assert ok.kind == "ok" and (tmp_path / f"case{r.count}" / "plan.json").is_file()
    from fuzz_cases import _tree, _written
    given = {"in.json": b"{}", "sub/": b""}
    (tmp_path / "w" / "sub").mkdir(parents=True)
    (tmp_path / "w" / "in.json").write_bytes(b"{}")
    before = _tree(tmp_path / "w")
    assert _written(tmp_path / "w", before, given) == []
    (tmp_path / "w" / "in.json").write_bytes(b"[]")
    (tmp_path / "w" / "sub" / "half.pbtxt").write_bytes(b"op {")
    assert _written(tmp_path / "w", before, given) == ["sub/half.pbtxt", "in.json (changed)"]


def test_a_case_past_its_time_cap_is_a_timeout(tmp_path):
    from fuzz_cases import relu_chain
    case = Case("slow", ["plan", "chain.pbtxt", "--input", "b0=2,2"], {"chain.pbtxt": relu_chain(20000).encode()})
    with CliRunner(tmp_path, MEM_CAP_BYTES, time_cap_s=0.5) as r:
        outcome = r.run(case)
        assert outcome.kind == "timeout" and "Traceback" in outcome.detail
        assert r.run(Case("after", ["inspect", "nope.pbtxt"])).kind == "refused"  # the worker lives on


def test_the_memory_cap_binds_and_run_says_so(tmp_path):
    """Under a 1 GiB address-space cap, a run needing ~1.5 GiB is refused before any
    allocation, naming the limit it met (not numpy's MemoryError)."""
    from fuzz_cases import FC_NET, fc_init
    case = Case("big", ["run", "mlp.pbtxt", "--init-net", "init.pbtxt", "--input", "data=50000000,8", "--quiet"],
                {"mlp.pbtxt": FC_NET.encode(), "init.pbtxt": fc_init(4, 8).encode()})
    with CliRunner(tmp_path, 1 << 30, TIME_CAP_S) as r:
        outcome = r.run(case)
    assert outcome.kind == "refused", outcome.detail or outcome.stderr
    assert "address-space limit" in outcome.stderr and "GiB" in outcome.stderr


ONNX_CASES = onnx_cases()


@pytest.mark.parametrize("case,expected", ONNX_CASES, ids=[c.name for c, _ in ONNX_CASES])
def test_onnx_file_case(runner, case, expected):
    """A bad ONNX file (truncated, an opset outside what is read, a missing initializer, a
    cycle, an op with no mapping, ...) is one line naming what is wrong; a valid one runs."""
    outcome = runner.run(case)
    _contract(outcome)
    if expected is None:
        assert outcome.kind == "ok", outcome.stderr
    elif expected:
        assert outcome.kind == "refused" and expected in outcome.stderr, outcome.stderr
