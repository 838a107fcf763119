"""The package is ready to publish (issue 66): `python -m build` makes a
wheel that installs into a fresh environment and runs a command through
the queue there. Built without isolation and installed without an index:
nothing is fetched."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(240)
def test_python_m_build_makes_a_wheel_that_installs_and_runs(tmp_path: Path) -> None:
    pytest.importorskip("build")
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                            str(tmp_path / "dist"), str(REPO)], capture_output=True, text=True, timeout=180,
                           stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("slotq-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "slotq/__main__.py" in names and "slotq/py.typed" in names
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n], names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, stdin=subprocess.DEVNULL)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                                "--no-deps", "--disable-pip-version-check", str(wheel)], capture_output=True,
                               text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = dict(os.environ, SLOTQ_STATE_DIR=str(tmp_path / "state"), SLOTQ_LEDGER=str(tmp_path / "ledger.sqlite"),
               XDG_STATE_HOME=str(tmp_path / "xdg"), XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    env.pop("SLOTQ_CONFIG", None)
    ran = subprocess.run([str(venv / "bin" / "slotq"), "run", "-q", "--", "echo", "from the wheel"], env=env,
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert (ran.returncode, ran.stdout) == (0, "from the wheel\n"), ran.stderr
