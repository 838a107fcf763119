"""Several hosts as one line (issue 49, DESIGN.md 7): `run --host A,B,C`
waits in every host's line and takes the first slot won; every other place
is withdrawn at once -- against the test sshd's hosts slotq-a..-c (one
server, a state dir of each test's own per host), through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Start, slotq_cmd, wait_for
from slotq.client.ledger import Ledger

HOSTS = ("slotq-a", "slotq-b", "slotq-c")


class Hosts:
    """This test's view of the hosts: a state dir of its own on each."""

    def __init__(self, cfg: str) -> None:
        self.cfg = cfg
        self.tag = uuid.uuid4().hex[:10]
        state = f"$HOME/lb-{self.tag}-$SLOTQ_TEST_HOST"  # its history's index too (beside the ledger)
        self.remote_slotq = f"SLOTQ_STATE_DIR={state} SLOTQ_LEDGER={state}/ledger/l.sqlite slotq"

    def args(self, *hosts: str) -> list[str]:
        return ["--host", ",".join(hosts), "--ssh-config", self.cfg, "--remote-slotq", self.remote_slotq]

    def shared(self, host: str) -> dict[str, Any]:
        proc = subprocess.run(slotq_cmd() + ["status", "--json", *self.args(host)], capture_output=True, text=True,
                              timeout=20, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        return dict(next(p for p in json.loads(proc.stdout)["pools"] if p["pool"] == "shared"))

    def history(self, host: str) -> list[dict[str, Any]]:
        proc = subprocess.run(slotq_cmd() + ["history", "--json", "--since", "1h", *self.args(host)],
                              capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        return [dict(r) for r in json.loads(proc.stdout)]

    def gate(self, host: str) -> str:
        return f"/tmp/slotq-lb-{self.tag}-{host}"  # one machine: the test opens it with a local touch

    def hold(self, runs: Start, host: str) -> None:
        """A holder on `host` until its gate opens."""
        runs(*self.args(host), "--label", f"holder-{host}", "--",
             "sh", "-c", f'while [ ! -e {self.gate(host)} ]; do sleep 0.01; done', name=f"holder-{host}")
        wait_for(lambda: self.shared(host)["slots"][0].get("phase") == "running", timeout=30,
                 what=f"the holder on {host}")

    def open(self, *hosts: str) -> None:
        for h in hosts:
            Path(self.gate(h)).touch()

    def cleanup(self) -> None:
        self.open(*HOSTS)
        for h in HOSTS:
            subprocess.run(["ssh", "-F", self.cfg, h, f'rm -rf "$HOME/lb-{self.tag}-$SLOTQ_TEST_HOST"'],
                           capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
            Path(self.gate(h)).unlink(missing_ok=True)


@pytest.fixture
def hosts(ssh_config: str, state_dir: Path) -> Iterator[Hosts]:
    h = Hosts(ssh_config)
    yield h
    h.cleanup()


def waiting_everywhere(hosts: Hosts, names: tuple[str, ...], run_id: str | None = None) -> bool:
    """The run waits in each host's line, said to wait on the others too."""
    for h in names:
        line = hosts.shared(h)["waiting"]
        if len(line) != 1 or (run_id is not None and line[0]["run_id"] != run_id):
            return False
        if sorted(line[0].get("also_waiting_on") or []) != sorted(n for n in names if n != h):
            return False
    return True


@pytest.mark.timeout(120)
def test_the_first_slot_won_is_taken_and_every_other_place_withdrawn_at_once(
        hosts: Hosts, runs: Start, tmp_path: Path) -> None:
    for h in HOSTS:
        hosts.hold(runs, h)
    run = runs(*hosts.args(*HOSTS), "--report-every", "1", "--", "sh", "-c", "echo ran on $SLOTQ_TEST_HOST",
               name="bound")
    wait_for(lambda: waiting_everywhere(hosts, HOSTS), timeout=30, what="the run in all three lines")
    wait_for(lambda: "in line on 3 hosts" in run.err, timeout=10, what="a line of waiting naming the hosts")
    hosts.open("slotq-b")
    assert run.wait(timeout=60) == 0, run.err
    assert run.out == b"ran on b\n"
    res = run.result()
    assert res["outcome"] == "passed" and res["host"] == "slotq-b", (res["host"], res["transport"])
    assert res["transport"]["late_binding"] == {"hosts": list(HOSTS), "won": "slotq-b"}, res["transport"]
    assert "host slotq-b gave the first slot" in run.err
    # The other places went at once: their holders still hold a and c.
    for h in ("slotq-a", "slotq-c"):
        pool = hosts.shared(h)
        assert pool["waiting"] == [] and pool["slots"][0]["label"] == f"holder-{h}", pool
        assert [r for r in hosts.history(h) if r["run_id"] == res["run_id"]] == []  # a reservation leaves none
    [line] = [r for r in hosts.history("slotq-b") if r["run_id"] == res["run_id"]]
    assert line["outcome"] == "passed"
    # One wait, from the first ticket to the slot: not one per host.
    waits = [w for w in Ledger().records(str(tmp_path)) if w.run_id == res["run_id"] and w.kind == "queue"]
    assert len(waits) == 1 and waits[0].end is not None, waits


@pytest.mark.timeout(150)
def test_two_slots_offered_at_once_run_the_command_once(hosts: Hosts, runs: Start, tmp_path: Path) -> None:
    marker = f"/tmp/slotq-lb-ran-{hosts.tag}"
    winners: list[str] = []
    try:
        for round_ in range(3):
            for h in ("slotq-a", "slotq-b"):
                Path(hosts.gate(h)).unlink(missing_ok=True)
                hosts.hold(runs, h)
            run = runs(*hosts.args("slotq-a", "slotq-b"), "--", "sh", "-c", f"echo $SLOTQ_TEST_HOST >> {marker}",
                       name=f"bound{round_}")
            wait_for(lambda: waiting_everywhere(hosts, ("slotq-a", "slotq-b")), timeout=30,
                     what="the run in both lines")
            hosts.open("slotq-a", "slotq-b")  # both slots free within the holders' 10 ms poll
            assert run.wait(timeout=60) == 0, run.err
            won = run.result()["host"]
            lost = "slotq-b" if won == "slotq-a" else "slotq-a"
            wait_for(lambda: not hosts.shared(lost)["slots"][0]["held"], timeout=5, what=f"{lost}'s slot free")
            winners.append(won[-1])
            assert Path(marker).read_text().splitlines() == winners, "never two commands"
    finally:
        Path(marker).unlink(missing_ok=True)


@pytest.mark.timeout(120)
def test_a_host_whose_connection_ends_while_the_run_waits_is_left_out(hosts: Hosts, runs: Start) -> None:
    for h in ("slotq-a", "slotq-b"):
        hosts.hold(runs, h)
    run = runs(*hosts.args("slotq-a", "slotq-b"), "--report-every", "1", "--", "true", name="bound")
    wait_for(lambda: waiting_everywhere(hosts, ("slotq-a", "slotq-b")), timeout=30, what="the run in both lines")
    pid = hosts.shared("slotq-a")["waiting"][0]["pid"]
    subprocess.run(["ssh", "-F", hosts.cfg, "slotq-a", f"kill -9 {int(pid)}"], timeout=20, check=True)
    wait_for(lambda: "slotq-a (left out: its connection ended)" in run.err, timeout=15,
             what="a line naming the host left out")
    hosts.open("slotq-b")
    assert run.wait(timeout=60) == 0, run.err
    assert run.result()["host"] == "slotq-b"


@pytest.mark.timeout(120)
def test_every_host_free_the_run_takes_one_and_the_others_are_free_while_it_runs(hosts: Hosts, runs: Start) -> None:
    # All three slots free at once: each host offers its slot within
    # milliseconds, often before a slower runner has read its request (the
    # `pass` then comes with it). A reservation never holds a slot it does not
    # use for longer than a hand-over: the two others are free while it runs.
    gate = hosts.gate("bound")
    run = runs(*hosts.args(*HOSTS), "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done", name="bound")
    wait_for(lambda: "gave the first slot" in run.err, timeout=30, what="a slot taken")
    won = next(h for h in HOSTS if f"host {h} gave the first slot" in run.err)

    def others_free() -> bool:
        return all(not (p := hosts.shared(h))["slots"][0]["held"] and p["waiting"] == [] for h in HOSTS if h != won)

    try:
        wait_for(others_free, timeout=5, what="the other hosts' slots free, their lines empty")
        assert hosts.shared(won)["slots"][0].get("phase") == "running"
    finally:
        Path(gate).touch()
        code = run.wait(timeout=60)
        Path(gate).unlink()
    assert code == 0, run.err
    # Its work tree went to the winner once its slot was won (issue 66: the
    # record said `transferred` at the connections, and their time only).
    rec = run.result()
    ph = rec["phases"]
    assert ph["submitted"] <= ph["slot"] <= ph["transferred"] <= ph["started"] <= ph["ended"], ph
    assert rec["transfer_s"] >= rec["transport"]["rsync_s"] > 0, rec


@pytest.mark.timeout(120)
def test_a_caller_killed_with_three_reservations_has_them_all_withdrawn(
        hosts: Hosts, runs: Start, tmp_path: Path) -> None:
    for h in HOSTS:
        hosts.hold(runs, h)
    caller = subprocess.Popen(slotq_cmd() + ["run", *hosts.args(*HOSTS), "--", "true"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                              start_new_session=True)
    try:
        wait_for(lambda: waiting_everywhere(hosts, HOSTS), timeout=30, what="the run in all three lines")
        t0 = time.monotonic()
        os.killpg(caller.pid, signal.SIGKILL)
        caller.wait(timeout=10)
        wait_for(lambda: all(hosts.shared(h)["waiting"] == [] for h in HOSTS), timeout=10,
                 what="every place withdrawn")
        assert time.monotonic() - t0 <= 2.0 + 1.5  # 2 s, plus three status round trips to observe it
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()


@pytest.mark.timeout(60)
def test_spread_1_picks_one_host_and_a_group_names_the_hosts(
        hosts: Hosts, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts.hold(runs, "slotq-a")
    picked = subprocess.run(slotq_cmd() + ["run", *hosts.args("slotq-a", "slotq-b"), "--spread", "1", "--",
                                           "true"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert picked.returncode == 0, picked.stderr
    assert "chose host slotq-b" in picked.stderr
    config = tmp_path / "xdg" / "slotq" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[groups]\nlb = ["slotq-b", "slotq-c"]\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    args = hosts.args("@lb")
    grouped = subprocess.run(slotq_cmd() + ["run", "--json", "-", *args, "--", "true"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
    assert grouped.returncode == 0, grouped.stderr
    assert json.loads(grouped.stdout.splitlines()[-1])["transport"]["late_binding"]["hosts"] == ["slotq-b", "slotq-c"]
    args[1] = "@nope"
    unknown = subprocess.run(slotq_cmd() + ["run", *args, "--", "true"], capture_output=True, text=True, timeout=20)
    assert unknown.returncode == 64 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "no host group 'nope'" in unknown.stderr and "@lb" in unknown.stderr


def _detach(hosts: Hosts, cwd: Path, *extra: str) -> str:
    """`run --detach` over slotq-a and slotq-b: the run id once it has its places."""
    proc = subprocess.run(slotq_cmd() + ["run", *hosts.args("slotq-a", "slotq-b"), "--detach", *extra, "--",
                                         "sh", "-c", "echo ran on $SLOTQ_TEST_HOST"],
                          capture_output=True, text=True, timeout=60, cwd=cwd, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.timeout(150)
def test_a_kept_run_late_bound_over_two_hosts_waits_in_both_lines_and_is_attached_to_here(
        hosts: Hosts, runs: Start, tmp_path: Path) -> None:
    for h in ("slotq-a", "slotq-b"):
        hosts.hold(runs, h)
    run_id = _detach(hosts, tmp_path)
    wait_for(lambda: waiting_everywhere(hosts, ("slotq-a", "slotq-b"), run_id), timeout=30,
             what="the kept run in both lines")
    hosts.open("slotq-b")
    # Its process is kept here (it holds both places): attach finds it
    # with the hosts named too, as the MCP server's settings name them.
    back = subprocess.run(slotq_cmd() + ["attach", run_id, *hosts.args("slotq-a", "slotq-b"), "--for", "60s",
                                         "--json", str(tmp_path / "back.json")],
                          capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert back.returncode == 0, back.stderr
    assert back.stdout == "ran on b\n"
    res = json.loads((tmp_path / "back.json").read_text())
    assert res["outcome"] == "passed" and res["host"] == "slotq-b", (res["host"], res["transport"])
    pool = hosts.shared("slotq-a")
    assert pool["waiting"] == [] and pool["slots"][0]["label"] == "holder-slotq-a", pool  # its place there went
    # One wait, from the first ticket to the slot, recorded here.
    waits = [w for w in Ledger().records(str(tmp_path)) if w.run_id == run_id and w.kind == "queue"]
    assert len(waits) == 1 and waits[0].end is not None, waits


@pytest.mark.timeout(150)
def test_a_kept_late_bound_runs_cancel_and_lease_end_every_place(hosts: Hosts, runs: Start, tmp_path: Path) -> None:
    for h in ("slotq-a", "slotq-b"):
        hosts.hold(runs, h)
    both = ("slotq-a", "slotq-b")
    cancelled = _detach(hosts, tmp_path)
    wait_for(lambda: waiting_everywhere(hosts, both, cancelled), timeout=30, what="the kept run in both lines")
    # Named with its hosts, as the MCP server's settings name them: the run
    # is kept here, and cancelled once, not "not found" on the other host.
    proc = subprocess.run(slotq_cmd() + ["cancel", cancelled, *hosts.args(*both)], capture_output=True, text=True,
                          timeout=90, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and f"cancelled run {cancelled}" in proc.stderr, proc.stderr
    wait_for(lambda: all(hosts.shared(h)["waiting"] == [] for h in both), timeout=20, what="both places withdrawn")
    # Nobody attached within the lease: it ends, and every place with it.
    lapsed = _detach(hosts, tmp_path, "--lease", "3s")
    wait_for(lambda: waiting_everywhere(hosts, both, lapsed), timeout=30, what="the second kept run in both lines")
    wait_for(lambda: all(hosts.shared(h)["waiting"] == [] for h in both), timeout=30,
             what="both places withdrawn when the lease ended")
    back = subprocess.run(slotq_cmd() + ["attach", lapsed, "--json", str(tmp_path / "lapsed.json")],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert json.loads((tmp_path / "lapsed.json").read_text())["outcome"] == "caller_gone", back.stderr


@pytest.mark.timeout(150)
def test_the_tree_sent_after_the_wait_is_the_directory_named_when_the_run_was_asked_for(
        hosts: Hosts, runs: Start, tmp_path: Path) -> None:
    # Issue 65, row 20: an MCP server allows ~/proj; a late-bound run from
    # ~/proj/sub waits, and meanwhile `sub` becomes a link to ~/outside: the
    # tree sent after the wait came from outside the allowed dirs.
    for h in ("slotq-a", "slotq-b"):
        hosts.hold(runs, h)
    proj, outside = tmp_path / "proj", tmp_path / "outside"
    sub = proj / "sub"
    sub.mkdir(parents=True)
    outside.mkdir()
    (sub / "which").write_text("inside\n")
    (outside / "which").write_text("outside\n")
    proc = subprocess.Popen(slotq_cmd() + ["run", "--json", str(tmp_path / "r.json"),
                                           *hosts.args("slotq-a", "slotq-b"), "--", "cat", "which"],
                            cwd=sub, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: waiting_everywhere(hosts, ("slotq-a", "slotq-b")), timeout=30, what="the run in both lines")
        sub.rename(proj / "sub.orig")
        sub.symlink_to(outside)
        hosts.open("slotq-a")
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == b"inside\n"  # before: "outside"
