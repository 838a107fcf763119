"""The agent's path, finished (issue 66): a default a harness sets once
that keeps every `slotq run`'s place, durations that round-trip between
processes, options in any order, attaches that show what is new, and the
MCP server's words -- through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Start, history_written, live_tickets, slotq_cmd, start_holder, wait_for


def slotq(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=None if env is None else {**os.environ, **env})


# ---------------------------------------------------------------- 1: the default that keeps the place

@pytest.mark.timeout(60)
def test_slotq_attach_for_in_the_environment_keeps_every_runs_place(state_dir: Path, runs: Start,
                                                                      tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    began = time.monotonic()
    left = slotq("run", "--json", str(tmp_path / "r.json"), "--", "echo", "hello", env={"SLOTQ_ATTACH_FOR": "2s"})
    assert left.returncode == 75, left.stderr  # before: a plain run, its place lost with the harness's kill
    assert 2.0 <= time.monotonic() - began < 8.0
    run_id = json.loads((tmp_path / "r.json").read_text())["run_id"]
    assert f"slotq attach {run_id}" in left.stderr.strip().splitlines()[-1]
    assert len(live_tickets(state_dir)) == 1  # its place, kept
    gate.touch()
    back = slotq("attach", run_id, "--json", str(tmp_path / "back.json"))
    assert back.returncode == 0 and back.stdout == "hello\n", back.stderr
    assert json.loads((tmp_path / "back.json").read_text())["outcome"] == "passed"


@pytest.mark.timeout(60)
def test_attach_for_in_your_config_keeps_every_runs_place_and_the_options_win(state_dir: Path, runs: Start,
                                                                              tmp_path: Path) -> None:
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "slotq" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[defaults]\nattach_for = "1s"\n')
    config.chmod(0o644)
    try:
        gate = tmp_path / "gate"
        start_holder(runs, state_dir, gate)
        left = slotq("run", "-q", "--", "true")
        assert left.returncode == 75, left.stderr
        # The environment wins over the config, an option over both.
        began = time.monotonic()
        assert slotq("run", "-q", "--attach-for", "3s", "--", "true", env={"SLOTQ_ATTACH_FOR": "1s"}).returncode == 75
        assert time.monotonic() - began >= 3.0
        plain = subprocess.Popen(slotq_cmd() + ["run", "--no-attach", "--", "true"], stdin=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env={**os.environ, "SLOTQ_ATTACH_FOR": "1s"})
        wait_for(lambda: len(live_tickets(state_dir)) == 3, what="the plain run in line behind the kept ones")
        time.sleep(1.5)  # sleep-ok: past the 1 s a kept run would have stayed attached
        assert plain.poll() is None  # a plain run: it stays with its caller
        plain.send_signal(signal.SIGTERM)  # as `timeout` does
        _, err = plain.communicate(timeout=20)
        assert plain.returncode == 130
        assert err.strip().splitlines()[-1] == ("slotq: to keep the place when a harness stops the call, set "
                                                 "SLOTQ_ATTACH_FOR=D (or --attach-for D): the run outlives the call "
                                                 "(exit 75) and `slotq attach RUN_ID` comes back to it"), err
    finally:
        config.unlink()
        gate.touch()


@pytest.mark.timeout(60)
def test_a_plain_run_killed_in_line_says_in_its_history_how_to_keep_its_place(state_dir: Path, runs: Start,
                                                                                tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    doomed = subprocess.Popen(slotq_cmd() + ["run", "--label", "doomed", "--", "true"], stdin=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the run in line")
    os.killpg(doomed.pid, signal.SIGKILL)  # the harness's kill of the whole group
    doomed.wait()
    gate.touch()
    slotq("status")  # (a look at the line buries a dead ticket nobody waits behind: its line is written then)
    line = wait_for(lambda: next((r for r in history_written(state_dir) if r.get("label") == "doomed"), None),
                    timeout=30, what="its history line")
    assert line["outcome"] == "caller_gone" and "SLOTQ_ATTACH_FOR=D" in line["message"], line


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["soon", "-1s", "1 minute", ""])
def test_a_bad_slotq_attach_for_is_a_usage_error_naming_it(state_dir: Path, value: str) -> None:
    proc = slotq("run", "--", "true", env={"SLOTQ_ATTACH_FOR": value})
    assert proc.returncode == 64, proc.stderr
    assert proc.stderr.startswith("slotq run: error: SLOTQ_ATTACH_FOR=") and proc.stderr.count("\n") == 1, proc.stderr


# ---------------------------------------------------------------- 2: durations that round-trip

def test_every_duration_handed_between_processes_reads_back_exactly() -> None:
    import random

    from slotq.durations import MAX_DURATION, exact, parse_duration

    rnd = random.Random(66)
    values = [1e-6, 0.001, 0.1, 1 / 3, 1.0, 59.999, 999999.0, 1_000_000.0, 1_036_800.0, 1e6 + 0.5, MAX_DURATION,
              *(rnd.uniform(0, MAX_DURATION) for _ in range(2000)), *(10 ** rnd.uniform(-6, 6.4) for _ in range(2000))]
    for v in values:
        text = exact(v)
        assert parse_duration(text) == v, (v, text)  # before: `:g` wrote 1.0368e+06, read as the unit 'e'
        assert "e" not in text[:-1].lower(), text


@pytest.mark.timeout(60)
def test_a_kept_run_with_a_lease_and_idle_of_twelve_days_waits_and_runs(state_dir: Path, runs: Start,
                                                                       tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    left = slotq("run", "--detach", "--lease", "12d", "--idle", "12d", "--", "echo", "ran")
    assert left.returncode == 0, left.stderr  # before: unavailable (121), "unknown unit 'e' in '1.0368e+06'"
    run_id = left.stdout.strip()
    waiting = [w for p in json.loads(slotq("status", "--json").stdout)["pools"] for w in p["waiting"]]
    assert [(w["run_id"], w["kept"]) for w in waiting] == [(run_id, {"lease_s": 1_036_800.0})]
    gate.touch()
    back = slotq("attach", run_id)
    assert back.returncode == 0 and back.stdout == "ran\n", back.stderr


@pytest.mark.timeout(30)
def test_a_lease_shorter_than_its_floor_is_refused_saying_what_it_would_do(state_dir: Path) -> None:
    proc = slotq("run", "--detach", "--lease", "1ms", "--", "true")
    assert proc.returncode == 64 and "shorter than the minimum of 1s" in proc.stderr, proc.stderr
    import slotq as api
    from slotq.errors import UsageError

    with pytest.raises(UsageError, match="at least 1 second"):
        api.submit(["true"], lease=0.001)


# ---------------------------------------------------------------- 3: options in any order

@pytest.mark.timeout(60)
def test_attach_and_cancel_take_their_options_anywhere_before_the_run_id_or_after(state_dir: Path, runs: Start,
                                                                                   tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    run_id = slotq("run", "--detach", "--", "echo", "hi").stdout.strip()
    for argv in (["-q", run_id, "--for", "1s"], [run_id, "-q", "--for", "1s"], ["--for", "1s", "-q", run_id]):
        proc = slotq("attach", *argv)
        assert proc.returncode == 75, (argv, proc.stderr)  # before: 64, "unexpected argument '--for'"
    other = slotq("run", "--detach", "--label", "other", "--", "true").stdout.strip()
    cancel = slotq("cancel", "--label", "other", other)
    assert cancel.returncode == 0 and f"cancelled run {other}" in cancel.stderr, cancel.stderr
    gate.touch()
    assert slotq("attach", run_id, "-q").stdout == "hi\n"


@pytest.mark.timeout(30)
def test_a_bare_word_before_the_double_dash_is_a_usage_error_naming_it(state_dir: Path, tmp_path: Path) -> None:
    proc = slotq("run", "--budget", "10", "minutes", "--", "touch", str(tmp_path / "ran"))
    assert proc.returncode == 64, proc.stderr  # before: 127, "command not found: 'minutes'"
    assert "unexpected argument 'minutes' before `--`" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "ran").exists()
    # Without a `--`, the command starts at the first word that is no option, as ever.
    assert slotq("run", "-q", "touch", str(tmp_path / "ran")).returncode == 0 and (tmp_path / "ran").exists()


# ---------------------------------------------------------------- 4: an attach shows what is new

def _waited(stderr: str) -> list[float]:
    """The waits the `waiting ...` status lines say, in order."""
    from slotq.durations import parse_duration

    return [parse_duration(line.split()[2].rstrip(";"), allow_zero=True)
            for line in stderr.splitlines() if line.startswith("slotq: waiting ")]


@pytest.mark.timeout(60)
def test_an_attach_shows_the_reports_since_the_last_attacher_then_one_current_line(state_dir: Path, runs: Start,
                                                                                  tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    left = slotq("run", "--attach-for", "1.5s", "--report-every", "0.3s", "--json", str(tmp_path / "r.json"), "--",
                 "echo", "hi")
    assert left.returncode == 75, left.stderr
    run_id = json.loads((tmp_path / "r.json").read_text())["run_id"]
    first = _waited(left.stderr)
    assert len(first) >= 3, left.stderr
    again = slotq("attach", run_id, "--for", "0.3s")
    assert again.returncode == 75
    seen = _waited(again.stderr)
    # Only reports after the first caller left (before: every one from the
    # run's start again, the first a stale "waiting 1ms").
    assert seen and min(seen) > max(first), (first, seen, again.stderr)
    time.sleep(1.0)  # sleep-ok: reports pile up in the log while nobody is attached
    now = slotq("attach", run_id, "--for", "0.1s")
    shown = _waited(now.stderr)
    assert 1 <= len(shown) <= 5 and min(shown) > max(seen), (seen, shown, now.stderr)
    quick = slotq("attach", run_id, "--for", "0s")
    current = _waited(quick.stderr)
    assert len(current) == 1 and current[0] >= max(shown), (shown, quick.stderr)  # one line: where it is now
    gate.touch()
    assert slotq("attach", run_id).stdout == "hi\n"
