"""`slotq history` and `slotq report` of remote hosts (--host), against the
project's sshd on 127.0.0.1: the hosts' own histories, over ssh."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from conftest import slotq_cmd
from remote_host import Remote
from test_report import browse, console_lines


# The host's `slotq history` keeps its index beside its user's wait ledger:
# in the test's state dir there (removed afterwards), not in the user's home.
REMOTE = ["--remote-slotq", 'SLOTQ_LEDGER="$SLOTQ_STATE_DIR/ledger/l.sqlite" slotq']


def _slotq(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    if args[0] in ("history", "report"):
        args += tuple(REMOTE)
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd)


@pytest.fixture
def two_hosts(ssh_config: str, state_dir: Path, tmp_path: Path) -> Iterator[tuple[str, ...]]:
    """slotq-a: a run that passed, then one that failed; slotq-b: one that
    passed, between them. Each host's state dir is emptied afterwards."""
    hosts = ("slotq-a", "slotq-b")
    for host in hosts:
        Remote(ssh_config, host).ssh('rm -rf "$SLOTQ_STATE_DIR"')
    common = ["--ssh-config", ssh_config]
    for host, label, cmd in (("slotq-a", "first", "true"), ("slotq-b", "second", "true"),
                             ("slotq-a", "third", "false")):
        proc = _slotq("run", "-q", "--host", host, *common, "--label", label, "--", cmd, cwd=tmp_path)
        assert proc.returncode == (1 if cmd == "false" else 0), proc.stderr
    yield hosts
    for host in hosts:
        Remote(ssh_config, host).ssh('rm -rf "$SLOTQ_STATE_DIR"')


@pytest.mark.timeout(90)
def test_history_of_several_hosts_is_one_list_oldest_first_and_a_host_that_is_down_hides_no_other(
        ssh_config: str, two_hosts: tuple[str, ...]) -> None:
    # `--host` was an unknown option: a host's history took a shell on it.
    proc = _slotq("history", "--host", "slotq-a,slotq-down,slotq-b", "--ssh-config", ssh_config)
    assert proc.returncode == 121, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN_ID", "HOST", "USER"], proc.stdout
    assert [(ln.split()[1], ln.split()[-1]) for ln in lines[1:-1]] == [
        ("slotq-a", "first"), ("slotq-b", "second"), ("slotq-a", "third")], proc.stdout
    assert lines[-1] == "3 run(s)"
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("slotq history: error: cannot connect to host slotq-down:"), proc.stderr

    # The filters are the host's, and --limit is the newest N of them all.
    proc = _slotq("history", "--host", "slotq-a,slotq-b", "--ssh-config", ssh_config, "--json", "--limit", "2")
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)
    assert [(r["host"], r["label"], r["outcome"], r["exit_code"]) for r in runs] == [
        ("slotq-b", "second", "passed", 0), ("slotq-a", "third", "failed", 1)]
    proc = _slotq("history", "--host", "slotq-a,slotq-b", "--ssh-config", ssh_config, "--outcome", "failed")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "1 run(s)", proc.stdout
    # A host named twice is asked once (its runs were listed twice).
    proc = _slotq("history", "--host", "slotq-a, slotq-b,slotq-a", "--ssh-config", ssh_config)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "3 run(s)", proc.stdout
    # One host: its history as a local one reads, no HOST column.
    proc = _slotq("history", "--host", "slotq-b", "--ssh-config", ssh_config, "--label", "sec")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["RUN_ID", "USER"] and proc.stdout.endswith("second\n1 run(s)\n"), proc.stdout


@pytest.mark.timeout(120)
def test_report_of_several_hosts_is_one_page_with_a_lane_per_host_and_slot(
        ssh_config: str, two_hosts: tuple[str, ...], tmp_path: Path) -> None:
    page = tmp_path / "runs.html"
    proc = _slotq("report", "--html", str(page), "--host", "slotq-a,slotq-b", "--ssh-config", ssh_config)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "slotq runs on slotq-a, slotq-b" in text
    assert re.search(r"<td>slotq-a:shared</td><td>2</td>.*<td>failed 1, passed 1</td>", text), text[:3000]
    assert re.search(r"<td>slotq-b:shared</td><td>1</td>.*<td>passed 1</td>", text), text[:3000]
    dom, log = browse(page, tmp_path, "--dump-dom")
    assert console_lines(log) == [], console_lines(log)
    assert 'data-ready="1"' in dom, "the page's script did not finish"
    assert len(re.findall(r'<rect class="run"', dom)) == 3
    assert ">slotq-a:shared#0<" in dom and ">slotq-b:shared#0<" in dom

    # A host that cannot be asked: the page of the others, and its error.
    proc = _slotq("report", "--html", str(page), "--host", "slotq-b,slotq-down", "--ssh-config", ssh_config)
    assert proc.returncode == 121 and "slotq-b:shared" in page.read_text(), proc.stderr
    wrote, error = proc.stderr.splitlines()
    assert wrote.startswith(f"slotq report: wrote {page}: 1 run(s) from "), proc.stderr
    assert error.startswith("slotq report: error: cannot connect to host slotq-down:"), proc.stderr
    assert error.endswith("(the page shows the other hosts)")
    # None can: no page (the old one is left as it was), exit 121.
    before = page.read_bytes()
    proc = _slotq("report", "--html", str(page), "--host", "slotq-down", "--ssh-config", ssh_config)
    assert proc.returncode == 121 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert page.read_bytes() == before


@pytest.mark.timeout(60)
def test_a_history_a_host_sends_is_checked_before_it_is_shown(
        remote: Remote, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a host answers is read with limits and each run's fields made
    # the types the table relies on: a broken or hostile host is its error
    # (unavailable, naming it), never a traceback, never unbounded memory.
    from slotq.errors import HostUnavailable
    from slotq.transports import ssh

    host = ssh.SshHost(remote.host, config=remote.cfg)
    hostile = json.dumps([{"run_id": 5, "user": ["x"], "phases": "soon", "exit_code": "1", "waited_s": "2s",
                           "outcome": "failed", "label": "\x1b[2Jhi"}])
    host.remote_slotq = f"echo '{hostile}'; :"
    (run,) = host.history([])
    assert (run["run_id"], run["user"], run["phases"], run["exit_code"], run["waited_s"]) == (None,) * 5
    assert run["host"] == remote.host and run["blame"] == "work"
    from slotq.cli.history import format_runs

    assert "\x1b" not in format_runs([run])
    for answer, why in (("'{}'", "not a list of runs"), ("'[1, 2]'", "not a list of runs"),
                        ("'[{'", "unreadable history"), ("'" + "[" * 100 + "'", "unreadable history")):
        host.remote_slotq = f"echo {answer}; :"
        with pytest.raises(HostUnavailable, match=re.escape(why)):
            host.history([])
    monkeypatch.setattr(ssh, "HISTORY_LIMIT", 1 << 20)
    host.remote_slotq = "head -c 5000000 /dev/zero; true"
    with pytest.raises(HostUnavailable, match=r"its history is larger than 1 MiB \(ask for a shorter window"):
        host.history([])
    host.remote_slotq = "echo 'no such table' >&2; exit 73; :"
    with pytest.raises(HostUnavailable, match="history failed \\(exit 73\\): no such table"):
        host.history([])
