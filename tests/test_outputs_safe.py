"""Nothing the user had is lost: no output of a command replaces a file it reads (named or
found beside NET, through any path to it), two outputs on one path are refused, a folder
output never replaces a folder of other files, FIFOs are written and not replaced, and a
command stopped by SIGINT, SIGTERM or SIGHUP leaves every output as it was and no
temporary file. Each case snapshots every file of its folder before the command and
compares byte for byte after it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from placer.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "placer" / "examples" / "data"
FAST = ["--time-limit", "1", "--stability-draws", "0"]


def _project(folder: Path) -> Path:
    """A model-zoo folder: the net, its init net and value_info.json found beside it, the
    user's notes, a manifest.json of the user's own, a symbolic and a hard link to the init net."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "resnet_small.pbtxt", folder / "predict_net.pbtxt")
    shutil.copy(EXAMPLES / "resnet_small_init.pbtxt", folder / "init_net.pbtxt")
    shutil.copy(EXAMPLES / "resnet_small.value_info.json", folder / "value_info.json")
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "manifest.json").write_text('{"mine": true}\n')
    os.symlink("init_net.pbtxt", folder / "link.pbtxt")
    os.link(folder / "init_net.pbtxt", folder / "hard.pbtxt")
    return folder


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a file's bytes, a link's target, a FIFO as 'fifo'."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = "link->" + os.readlink(p)
        elif stat.S_ISFIFO(p.lstat().st_mode):
            out[key] = "fifo"
        elif p.is_file():
            out[key] = p.read_bytes()
        else:
            out[key] = "dir"
    return out


def _temporaries(folder: Path) -> list[Path]:
    """Temporary files and folders left in ``folder`` or beside it."""
    return [p for p in [*folder.rglob(".*"), *folder.parent.glob(".*")] if p.name.endswith((".tmp", ".old"))]


def _refused(capsys, argv: list[str], folder: Path) -> str:
    """Run ``argv``: exit 2, one line on stderr, every file as it was, no temporary left."""
    before = _snapshot(folder)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("placer: error: "), err
    assert _snapshot(folder) == before
    assert _temporaries(folder) == []
    return err


@pytest.fixture
def proj(tmp_path, monkeypatch):
    folder = _project(tmp_path / "proj")
    monkeypatch.chdir(folder)
    return folder


# ---------------------------------------------------------------- outputs that are inputs

NET = "predict_net.pbtxt"
INPUT_AS_OUTPUT = [
    ["plan", NET, "-o", "init_net.pbtxt"],                 # the init net found beside NET
    ["plan", NET, "--init-out", "./init_net.pbtxt"],
    ["plan", NET, "--init-out", "link.pbtxt"],             # through a symbolic link
    ["plan", NET, "--graph-out", "hard.pbtxt"],            # through a hard link
    ["plan", NET, "--plan-out", "value_info.json"],        # the shapes found beside NET
    ["plan", NET, "--plan-out", "ok.json", "--report", "../proj/value_info.json"],
    ["run", NET, "--record", "init_net.pbtxt"],
    ["run", NET, "--save-init", "value_info.json"],
    ["run", NET, "--outputs", "hard.pbtxt"],
    ["run", NET, "--trace", "link.pbtxt"],
    ["run", NET, "--outputs", NET],
]


@pytest.mark.parametrize("argv", INPUT_AS_OUTPUT, ids=" ".join)
def test_an_input_is_never_an_output(proj, capsys, argv):
    extra = FAST if argv[0] == "plan" else ["--quiet"]
    err = _refused(capsys, [*argv, *extra], proj)
    assert "refusing to overwrite an input" in err
    assert not (proj / "ok.json").exists(), "an output was written before the refusal"


def test_the_input_arrays_are_inputs_too(proj, capsys):
    import numpy as np
    np.savez(proj / "x.npz", data=np.zeros((1, 3, 32, 32), np.float32))
    assert "refusing to overwrite" in _refused(capsys, ["run", NET, "--inputs", "x.npz", "--record", "./x.npz",
                                                         "--quiet"], proj)


# ---------------------------------------------------------------- two outputs on one path

SAME_PATH = [
    ["run", NET, "--record", "x", "--trace", "x", "--quiet"],
    ["run", NET, "--outputs", "x", "--save-init", "./x", "--quiet"],
    ["plan", NET, "-o", "out.pbtxt", "--plan-out", "out.value_info.json", *FAST],  # the shapes beside -o
    ["plan", NET, "--plan-out", "x", "--trace", "sub/../x", *FAST],
]


@pytest.mark.parametrize("argv", SAME_PATH, ids=" ".join)
def test_two_outputs_on_one_path_are_refused(proj, capsys, argv):
    err = _refused(capsys, argv, proj)
    assert "the same file as" in err
    assert not (proj / "x").exists() and not (proj / "out.pbtxt").exists()


def test_report_with_two_outputs_on_one_path(proj, capsys):
    assert main(["plan", NET, "--plan-out", "plan.json", *FAST]) == 0
    capsys.readouterr()
    assert "the same file as -o" in _refused(capsys, ["report", "plan.json", "-o", "r", "--trace", "r"], proj)


# ---------------------------------------------------------------- folders

@pytest.mark.parametrize("out", ["proj", ".", "$PWD", "sub"], ids=["proj", "dot", "pwd", "holds-an-input"])
def test_a_cluster_plan_never_replaces_a_folder_of_the_users(proj, capsys, monkeypatch, out):
    if out == "proj":           # run from the parent, the project folder as -o
        monkeypatch.chdir(proj.parent)
        argv = ["plan", "proj/predict_net.pbtxt"]
    elif out == "sub":          # a folder placer wrote, but it holds this command's input
        monkeypatch.chdir(proj.parent)
        assert main(["plan", "proj/predict_net.pbtxt", "--cluster", "local-2hosts", "-o", "proj/sub", *FAST]) == 0
        capsys.readouterr()
        argv, out = ["plan", "proj/sub/one_process.pbtxt"], "proj/sub"
    else:
        argv = ["plan", NET]
    out = str(proj) if out == "$PWD" else out
    err = _refused(capsys, [*argv, "--cluster", "local-2hosts", "-o", out, *FAST], proj)
    assert "-o" in err


def test_a_previous_cluster_plan_is_replaced_and_one_with_a_file_added_is_not(tmp_path, capsys):
    net = str(EXAMPLES / "resnet_small.pbtxt")
    out = tmp_path / "plan"
    assert main(["plan", net, "--cluster", "local-2hosts", "-o", str(out), *FAST]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert manifest["placer_output"] == "cluster-plan" and set(manifest["files"]) | {"manifest.json"} == written
    (out / "plan.json").write_text("older")
    assert main(["plan", net, "--cluster", "local-2hosts", "-o", str(out), *FAST]) == 0  # the re-run
    assert json.loads((out / "plan.json").read_text())["ops"], "the previous plan was not replaced"
    assert _temporaries(out) == []
    capsys.readouterr()
    (out / "workers" / "notes.txt").write_text("mine")
    err = _refused(capsys, ["plan", net, "--cluster", "local-2hosts", "-o", str(out), *FAST], tmp_path)
    assert "not a previous `cluster-plan` output" in err
    (out / "workers" / "notes.txt").unlink()
    (out / "mine").mkdir()                     # an empty folder of the user's is theirs too
    _refused(capsys, ["plan", net, "--cluster", "local-2hosts", "-o", str(out), *FAST], tmp_path)


def test_convert_into_a_folder(tmp_path, capsys):
    proto = tmp_path / "deploy.prototxt"
    proto.write_text('name: "n"\ninput: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 8\ninput_dim: 8\n'
                     'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                     'inner_product_param { num_output: 2 } }\n')
    out = tmp_path / "out"
    assert main(["convert", str(proto), "-o", str(out)]) == 0
    first = _snapshot(out)
    assert json.loads(first["manifest.json"])["placer_output"] == "convert"
    assert main(["convert", str(proto), "-o", str(out)]) == 0      # a previous conversion: replaced
    assert _snapshot(out) == first
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    _refused(capsys, ["convert", str(proto), "-o", str(out)], tmp_path)
    _refused(capsys, ["convert", str(proto), "-o", str(tmp_path)], tmp_path)   # holds the prototxt
    # a cluster plan's folder is not a conversion's
    assert main(["plan", str(EXAMPLES / "resnet_small.pbtxt"), "--cluster", "local-2hosts",
                 "-o", str(tmp_path / "c"), *FAST]) == 0
    capsys.readouterr()
    assert "`convert`" in _refused(capsys, ["convert", str(proto), "-o", str(tmp_path / "c")], tmp_path)


@pytest.mark.parametrize("argv", [
    ["train-net", str(EXAMPLES / "resnet_small_train.pbtxt"), "--loss", "loss", "--optimizer", "sgd", "--lr", "0.1"],
    ["shard", str(EXAMPLES / "dlrm_small_train.pbtxt"), "--gpu-profile", "t4-pcie3", "--gpus", "2"],
], ids=lambda a: a[0])
def test_train_net_and_shard_refuse_a_folder_of_the_users(tmp_path, capsys, argv):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "train_net.pbtxt").write_text("my own train net")
    err = _refused(capsys, [*argv, "-o", str(tmp_path / "mine")], tmp_path)
    assert f"not a previous `{argv[0]}` output" in err


def test_demo_refuses_a_folder_of_the_users(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "summary.txt").write_text("my summary")
    assert "not a previous `demo` output" in _refused(capsys, ["demo", "-o", str(tmp_path / "mine"), "--quick",
                                                               "--quiet"], tmp_path)


# ---------------------------------------------------------------- special files and links

def test_a_fifo_is_written_not_replaced(proj, capsys):
    fifo = proj / "plan.fifo"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("text", fifo.read_text()), daemon=True)
    reader.start()
    code = main(["plan", NET, "--plan-out", str(fifo), *FAST])
    replaced = not stat.S_ISFIFO(fifo.lstat().st_mode)
    if replaced:  # release the reader, which waits on the FIFO's old node
        reader.join(timeout=1)
    else:
        reader.join(timeout=60)
    assert code == 0 and not replaced, "the FIFO was replaced by a file"
    assert json.loads(got["text"])["ops"]


def test_a_symbolic_link_output_is_written_through(proj, capsys):
    (proj / "old.json").write_text("old")
    os.symlink("old.json", proj / "plan.json")
    assert main(["plan", NET, "--plan-out", "plan.json", *FAST]) == 0
    assert (proj / "plan.json").is_symlink() and json.loads((proj / "old.json").read_text())["ops"]


def test_a_failing_output_leaves_the_ones_before_it_as_they_were(proj, capsys):
    (proj / "o.npz").write_bytes(b"previous")
    (proj / "folder").mkdir()
    err = _refused(capsys, ["run", NET, "--outputs", "o.npz", "--record", "folder", "--quiet"], proj)
    assert "folder" in err


# ---------------------------------------------------------------- signals

def _start(argv: list[str], cwd: Path, ignored: tuple = ()) -> subprocess.Popen:
    """``python -m placer.cli ARGV`` with SIGINT, SIGTERM, SIGHUP at their defaults (a
    background shell ignores SIGINT) but for ``ignored``."""
    def dispositions():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "placer.cli", *argv], cwd=cwd, env=env, preexec_fn=dispositions,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, folder: Path, pattern: str, timeout: float = 120) -> None:
    """Poll until a temporary matching ``pattern`` exists under ``folder`` (the command
    has staged an output and waits on its FIFO, which nobody reads)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if list(folder.glob(pattern)):
            return
        assert proc.poll() is None, f"the command ended first: {proc.stderr.read()}"
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {pattern} appeared in {timeout} s")


SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: s.name)
def test_a_signal_leaves_the_previous_outputs_and_no_temporary(proj, signum):
    (proj / "o.npz").write_bytes(b"previous outputs")
    (proj / "r.json").write_text("previous record")
    os.mkfifo(proj / "t.fifo")
    before = _snapshot(proj)
    proc = _start(["run", NET, "--outputs", "o.npz", "--record", "r.json", "--trace", "t.fifo", "--quiet"], proj)
    _wait_for(proc, proj, ".r.json.*.tmp")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err.strip() == "placer: interrupted"
    assert _snapshot(proj) == before and _temporaries(proj) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_removes_the_cluster_writers_temporary_folder(tmp_path, signum):
    os.mkfifo(tmp_path / "plan.fifo")
    (tmp_path / "keep.txt").write_text("mine")
    before = _snapshot(tmp_path)
    proc = _start(["plan", str(EXAMPLES / "resnet_small.pbtxt"), "--cluster", "local-2hosts", "-o", "out",
                   "--plan-out", "plan.fifo", *FAST], tmp_path)
    _wait_for(proc, tmp_path, ".out.*.tmp")
    proc.send_signal(signum)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum
    assert _snapshot(tmp_path) == before and not list(tmp_path.glob(".*"))


def test_a_hangup_ignored_by_nohup_stays_ignored(proj):
    os.mkfifo(proj / "t.fifo")
    proc = _start(["run", NET, "--record", "r.json", "--trace", "t.fifo", "--quiet"], proj, ignored=(signal.SIGHUP,))
    _wait_for(proc, proj, ".r.json.*.tmp")
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)  # a hangup acted on would end it at once; it must still be waiting on the FIFO
    assert proc.poll() is None, "SIGHUP ended a command started with it ignored"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and not (proj / "r.json").exists()


# An interrupt can land between any two bytecodes. Where the window is too narrow to hit
# with a real signal from outside, the interrupt is raised at that point in-process.

def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("stage", [True, False], ids=["staged", "unstaged"])
def test_an_interrupt_while_a_folder_is_committed_leaves_no_temporary(tmp_path, monkeypatch, stage):
    from placer import fileio
    (tmp_path / "keep.txt").write_text("mine")
    before = _snapshot(tmp_path)
    monkeypatch.setattr(fileio, "_refuse_reads_under", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        with fileio.command_scope(stage=stage):
            with fileio.OutputDir(tmp_path / "out", "-o", "test") as folder:
                fileio.atomic_write_text(folder.path("workers/a.pbtxt"), "a\n")
                folder.write_manifest()
    assert _snapshot(tmp_path) == before


def test_an_interrupt_right_after_a_temporary_is_made_leaves_none(tmp_path, monkeypatch):
    from placer import fileio
    made = []
    real = fileio._note_temp

    def note_then_interrupt(tmp):
        real(tmp)
        made.append(tmp)
        raise KeyboardInterrupt
    monkeypatch.setattr(fileio, "_note_temp", note_then_interrupt)
    for stage in (True, False):
        with pytest.raises(KeyboardInterrupt):
            with fileio.command_scope(stage=stage):
                fileio.atomic_write_text(tmp_path / "o.json", "{}\n")
    assert len(made) == 2 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stage", [True, False], ids=["staged", "unstaged"])
def test_folders_made_for_an_output_go_when_the_command_fails(tmp_path, stage):
    from placer import fileio
    (tmp_path / "mine").mkdir()                      # the user's empty folder stays
    with pytest.raises(KeyboardInterrupt):
        with fileio.command_scope(stage=stage):
            fileio.atomic_write_text(tmp_path / "mine" / "new" / "deeper" / "o.json", "{}\n")
            with fileio.OutputDir(tmp_path / "fresh" / "out", "-o", "test") as folder:
                fileio.atomic_write_text(folder.path("a.txt"), "a\n")
                raise KeyboardInterrupt
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    # unstaged, a file is in place once written (and its folders with it); staged, nothing is
    assert left == (["mine"] if stage else ["mine", "mine/new", "mine/new/deeper", "mine/new/deeper/o.json"])


def test_folders_made_for_an_output_stay_when_the_command_succeeds(tmp_path):
    from placer import fileio
    with fileio.command_scope(stage=True):
        fileio.atomic_write_text(tmp_path / "new" / "o.json", "{}\n")
    assert (tmp_path / "new" / "o.json").read_text() == "{}\n"
