"""`slotq completion`: each script completes commands, options and their
values in its real shell (Debian's bash, zsh and fish; scripts/test installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import slotq_cmd


def script(shell: str, tmp_path: Path) -> Path:
    proc = subprocess.run(slotq_cmd() + ["completion", shell], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / f"slotq.{shell}"
    path.write_text(proc.stdout)
    return path


def private_home(tmp_path: Path) -> dict[str, str]:
    """The shells write their own files (fish its config and history):
    into the test's temp dir, never the real user's home."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
                XDG_DATA_HOME=str(home / ".local/share"), XDG_CACHE_HOME=str(home / ".cache"))


def need(shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (scripts/test installs it as root)")


@pytest.mark.timeout(30)
def test_bash_completes_commands_options_choices_and_the_command_after_dashes(tmp_path: Path) -> None:
    path = script("bash", tmp_path)

    def complete(*words: str) -> list[str]:
        arr = " ".join(f"'{w}'" for w in words)
        out = subprocess.run(["bash", "-c", f"source {path}; COMP_WORDS=({arr}); COMP_CWORD={len(words) - 1}; "
                              "_slotq; printf '%s\\n' \"${COMPREPLY[@]}\""], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert complete("slotq", "ru") == ["run"]
    assert complete("slotq", "hi") == ["history"]
    assert complete("slotq", "run", "--bud") == ["--budget"]
    assert sorted(complete("slotq", "run", "--sync", "")) == ["none", "rsync"]
    assert complete("slotq", "history", "--outcome", "exec") == ["exec_timeout"]  # not the files here
    assert "--watch" in complete("slotq", "status", "--")
    assert "sh" in complete("slotq", "run", "--", "s")  # after --: a command name


@pytest.mark.timeout(30)
def test_fish_completes_commands_and_options(tmp_path: Path) -> None:
    need("fish")
    path = script("fish", tmp_path)

    def complete(line: str) -> list[str]:
        out = subprocess.run(["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"],
                             capture_output=True, text=True, timeout=30, env=private_home(tmp_path))
        assert out.returncode == 0, out.stderr
        return [ln.split("\t")[0] for ln in out.stdout.splitlines()]

    assert complete("slotq ru") == ["run"]
    assert complete("slotq run --bud") == ["--budget"]
    assert sorted(complete("slotq run --sync ")) == ["none", "rsync"]
    assert complete("slotq history --outcome exec") == ["exec_timeout"]


@pytest.mark.timeout(30)
def test_zsh_script_loads_as_a_completion_function(tmp_path: Path) -> None:
    need("zsh")
    path = script("zsh", tmp_path)
    out = subprocess.run(["zsh", "-f", "-c", f"autoload -U compinit; compinit -u -D; source {path}; "
                          "whence -w _slotq; print ${_comps[slotq]}"], capture_output=True, text=True, timeout=30,
                         env=private_home(tmp_path))
    assert out.returncode == 0 and out.stdout.split() == ["_slotq:", "function", "_slotq"], out


@pytest.mark.timeout(30)
def test_an_unknown_missing_or_second_shell_is_one_line_naming_it_exit_64() -> None:
    for args, says in ((["tcsh"], "'tcsh' is not a shell slotq completes (bash, zsh, fish)"),
                       ([], "name your shell: bash, zsh, fish"),  # was about a command after `--`
                       (["bash", "zsh"], "name one shell (bash, zsh, fish), not 2: bash zsh")):
        proc = subprocess.run(slotq_cmd() + ["completion", *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 64 and proc.stderr == f"slotq completion: error: {says}\n", (args, proc.stderr)
