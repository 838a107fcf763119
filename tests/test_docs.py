"""The front door (issue 48): the README fits on a page, every link in it
and in docs/ leads somewhere, and its commands run as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import slotq_cmd

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_README_LINES = 200
pytestmark = pytest.mark.timeout(60)


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # not in code blocks
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"https?://|mailto:|#", m)]


def test_the_readme_fits_on_a_page() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md is {lines} lines (at most {MAX_README_LINES}: the rest in docs/)"


@pytest.mark.parametrize("doc", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_link_resolves(doc: Path) -> None:
    missing = [target for target in links(doc) if not (doc.parent / target.split("#")[0]).exists()]
    assert not missing, f"{doc.relative_to(REPO)} links to {missing}"


def test_the_readme_install_and_test_commands_are_the_projects_own() -> None:
    text = README.read_text()
    install = next(line for line in text.splitlines() if line.startswith("scripts/install && "))
    assert os.access(REPO / "scripts" / "install", os.X_OK)
    assert "scripts/test\n" in text and os.access(REPO / "scripts" / "test", os.X_OK)
    assert "scripts/test" in (REPO / ".ci" / "run").read_text(), ".ci/run runs the README's test command"
    assert install.split(" && ", 1)[1].startswith(".venv/bin/slotq run ")


def test_the_readme_quick_start_runs_as_written(state_dir: Path, tmp_path: Path) -> None:
    line = next(line for line in README.read_text().splitlines() if line.startswith("scripts/install && "))
    argv = shlex.split(line.split(" && ", 1)[1])
    proc = subprocess.run(slotq_cmd() + argv[1:], capture_output=True, text=True, timeout=30, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and proc.stdout == "hello from the slot\n", proc.stderr


def test_help_run_shows_runs_help() -> None:
    proc = subprocess.run(slotq_cmd() + ["help", "run"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: slotq run [options] -- CMD [ARGS...]")
