"""The layer contract of pyproject.toml holds: ``lint-imports`` (scripts/test.sh runs it as its own stage too).

It also proves the contract bites: a module added in a copy of the tree that imports upward breaks it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports --no-cache`` in ``cwd`` with this interpreter (lint-imports analyses ``cwd``'s warren)."""
    if importlib.util.find_spec("importlinter") is None:
        pytest.fail("import-linter is not installed in this venv: it is in requirements.lock, run scripts/setup.sh")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", _LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def test_the_contracts_are_kept() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and "Contracts: 3 kept" in result.stdout, result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "warren", tmp_path / "warren", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "warren" / "store" / "upward.py").write_text("from warren.orchestrator import SandboxManager\n")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "warren.store is not allowed to import warren.orchestrator" in result.stdout, result.stdout
