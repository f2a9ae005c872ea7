"""The layout rules CONTRIBUTING.md states, checked: the stages import in layer order
(import-linter's contracts in pyproject.toml), no placer module is imported inside a
function, and the type checker passes over the typed documents and the stage protocols.
Each check is also shown to fail on a planted violation, so that none passes by accident.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "placer"
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def _copy_tree(tmp_path: Path) -> Path:
    """The package and its pyproject.toml, without the bundled data (the import graph
    only needs the modules)."""
    root = tmp_path / "tree"
    shutil.copytree(PACKAGE, root / "placer",
                    ignore=shutil.ignore_patterns("__pycache__", "data", "profiles", "templates"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_stages_import_in_layer_order():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("module, imported", [
    ("runtime/executor.py", "placer.planning.planner"),    # the runtime never plans
    ("ops/registry.py", "placer.partition"),                # a lower layer reaches up
    ("runtime/inputs.py", "placer.commands.run"),           # nothing imports the commands
])
def test_a_planted_violation_breaks_the_contract(tmp_path, module, imported):
    root = _copy_tree(tmp_path)
    path = root / "placer" / module
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    import {imported}  # noqa: F401\n")
    done = _lint(root)
    assert done.returncode != 0
    assert f"-> {imported}" in done.stdout, done.stdout


def function_level_imports(root: Path) -> list[str]:
    """``file:line module`` of every placer module imported inside a function."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    if name == "placer" or name.startswith("placer."):
                        found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return sorted(set(found))


def test_no_placer_module_is_imported_inside_a_function():
    """Heavy optional dependencies (cupy, ray, matplotlib, pandas, torch, onnx, jinja2) are
    imported where they are used; placer's own modules at the top, in layer order."""
    assert function_level_imports(PACKAGE) == []


def test_a_planted_function_level_import_is_found(tmp_path):
    root = _copy_tree(tmp_path)
    before = set(function_level_imports(root / "placer"))
    path = root / "placer" / "shapes.py"
    path.write_text(path.read_text() + "\n\ndef _planted():\n    from placer.ops import registry  # noqa: F401\n")
    new = set(function_level_imports(root / "placer")) - before
    assert [n.split(":")[0] + " " + n.split(" ")[1] for n in new] == ["shapes.py placer.ops"]


def _mypy(root: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_typed_boundaries_pass_the_type_checker(tmp_path):
    """The files ``[tool.mypy]`` names in pyproject.toml: the document models (with the
    pydantic plugin), the Partitioner protocol and its table, the sharding source."""
    done = _mypy(ROOT, tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success")


def test_a_planted_type_error_fails_the_type_checker(tmp_path):
    root = _copy_tree(tmp_path)
    path = root / "placer" / "partition" / "base.py"
    path.write_text(path.read_text() + "\n\ndef _planted() -> int:\n    return 'not an int'\n")
    done = _mypy(root, tmp_path / "cache")
    assert done.returncode == 1
    assert "partition/base.py" in done.stdout and "Incompatible return value type" in done.stdout, done.stdout
