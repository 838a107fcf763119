"""What `slotq run` refuses before a run starts (and `task` and `waits`
where they read the same): bad arguments, an unknown or missing class, an
unusable state dir, a bad host config, relative paths that would split
the queue or the ledger. One line on stderr each, and a distinct exit
code; nothing runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import Start, gate_cmd, history_written, live_tickets, slot_holder, slotq_cmd, start_holder, wait_for


def _one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]


@pytest.mark.parametrize("args,code,needle", [
    (["--class", "nope", "--", "true"], 64, "unknown class 'nope'"),
    (["--budget", "soon", "--", "true"], 64, "cannot read 'soon'"),
    (["--budget", "-5", "--", "true"], 64, "negative duration"),
    (["--idle", "1x", "--", "true"], 64, "unknown unit"),
    ([], 64, "no command given"),
    (["--"], 64, "no command given"),
    # ssh would read it as an option; it was exit 121, as if a host were down
    (["--host", "-oProxyCommand=touch pwned", "--", "true"], 64, "--host: not a host name: '-oProxyCommand"),
    (["--host", "127.0.0.1,-oProxyCommand=x", "--ssh-option", "Port=1", "--", "true"], 64,
     "--host: not a host name: '-oProxyCommand=x'"),
    # a host refuses a request with more (spec.MAX_TEXT): it ran here, and failed through --host or --slurm
    (["--label", "x" * 1001, "--", "true"], 64, "option --label: 1001 characters, more than the limit of 1000"),
    # Options of no effect without the one they belong to: the run went on
    # here, unprepared, and the user thought it ran on the host or limited.
    (["--prepare-timeout", "5s", "--", "true"], 64, "--prepare-timeout is the limit of --prepare: add --prepare"),
    (["--ssh-option", "Port=2222", "--", "true"], 64, "--ssh-option says how to reach --host: add --host"),
    (["--ssh-config", "/dev/null", "--", "true"], 64, "--ssh-config says how to reach --host: add --host"),
    (["--remote-slotq", "slotq", "--", "true"], 64, "--remote-slotq says how to reach --host: add --host"),
    (["--sync", "none", "--", "true"], 64, "--sync says how the work tree reaches --host: add --host"),
    # srun options that break how slotq runs a job: it was `unavailable`
    # (a corrupt stream, a missing result) or, for --job-name, a pending
    # job the sentinel could no longer find by name.
    (["--slurm", "--slurm-option=-n2", "--", "true"], 64,
     "option --slurm-option: '-n2' cannot be used with slotq (-n (--ntasks): slotq runs one task per job"),
    (["--slurm", "--slurm-option=--job-name=x", "--", "true"], 64,
     "'--job-name=x' cannot be used with slotq (--job-name: slotq names the job (slotq-<run id>)"),
    # a word without a dash: srun ran it as the program, in slotq's place
    (["--slurm", "--slurm-option=ci", "--", "true"], 64, "'ci' is not an srun option (they start with -;"),
])
def test_bad_arguments_get_one_line_and_exit_64(state_dir: Path, args: list[str], code: int, needle: str) -> None:
    proc = subprocess.run(slotq_cmd() + ["run"] + args, capture_output=True, text=True, timeout=20)
    assert proc.returncode == code
    _one_line_error(proc, needle)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["status", "history", "report", "waits"])
def test_each_readers_help_gives_the_exit_code_it_really_gives_for_bad_arguments(state_dir: Path,
                                                                                  command: str) -> None:
    # Their --help said "2 bad arguments", and report's said 74 for an
    # --html file it cannot write: both are 64.
    helped = subprocess.run(slotq_cmd() + [command, "--help"], capture_output=True, text=True, timeout=20)
    text = " ".join(helped.stdout.split())
    assert "64 bad arguments" in text and " 2 bad" not in text, text
    bad = subprocess.run(slotq_cmd() + [command, "--no-such-option"], capture_output=True, text=True, timeout=20)
    assert bad.returncode == 64 and bad.stderr.count("\n") == 1, bad.stderr
    if command == "report":
        assert "64 bad arguments (an --html file that cannot be written too)" in text, text
        unwritable = subprocess.run(slotq_cmd() + ["report", "--html", str(state_dir / "no" / "such" / "x.html")],
                                    capture_output=True, text=True, timeout=20)
        assert unwritable.returncode == 64, unwritable.stderr


@pytest.mark.timeout(30)
def test_ssh_defaults_from_the_environment_leave_a_run_here_alone(state_dir: Path) -> None:
    # $SLOTQ_SSH_CONFIG and $SLOTQ_REMOTE_SLOTQ are set once for every run;
    # only the options typed without --host are refused.
    env = dict(os.environ, SLOTQ_SSH_CONFIG="/dev/null", SLOTQ_REMOTE_SLOTQ="slotq")
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "echo", "ran"], capture_output=True, text=True,
                          timeout=20, env=env)
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
    for cmd in (["status"], ["cancel", "--mine"]):
        proc = subprocess.run(slotq_cmd() + cmd + ["--ssh-option", "Port=2222"], capture_output=True, text=True,
                              timeout=20)
        assert proc.returncode == 64, proc.stderr
        _one_line_error(proc, "--ssh-option says how to reach --host: add --host")


@pytest.mark.timeout(30)
def test_a_remote_run_from_the_root_or_home_directory_is_refused_not_copied(tmp_path: Path) -> None:
    # rsync copied all of it to the host, ~/.ssh and all.
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    env = dict(os.environ, HOME=str(home))
    down = ["--host", "127.0.0.1", "--ssh-option", "Port=1", "--ssh-option", "ConnectTimeout=5"]
    for cwd, what in (("/", "/, the root directory"), (home, f"{home}, your home directory"),
                      (tmp_path, f"{tmp_path}, a directory above your home ({home})")):
        proc = subprocess.run(slotq_cmd() + ["run", *down, "--", "true"], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=20)
        assert proc.returncode == 64, proc.stderr
        _one_line_error(proc, f"--host would copy {what}, to the host: run from your project's directory, "
                              "or add --sync none")
    # A project's directory is copied; with --sync none, home is not copied
    # at all. Both go on to the host (down here: unavailable, 121).
    for cwd, sync in ((home / "proj", []), (home, ["--sync", "none"])):
        proc = subprocess.run(slotq_cmd() + ["run", "-q", *sync, *down, "--", "true"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=20)
        assert proc.returncode == 121, proc.stderr


@pytest.mark.timeout(30)
def test_a_host_without_the_default_class_says_to_name_one(state_dir: Path) -> None:
    # "unknown class 'shared'" to a user who had named no class at all.
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "host.toml").write_text("[pools]\nci = 1\n")
    proc = subprocess.run(slotq_cmd() + ["run", "--", "true"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 64
    assert proc.stderr == ("slotq run: error: this host has no class 'shared', the default: name one of its "
                           "classes with --class (ci)\n")
    proc = subprocess.run(slotq_cmd() + ["run", "--class=ci", "--", "echo", "ran"], capture_output=True, text=True,
                          timeout=20)
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr


def test_an_unusable_state_directory_is_one_line_and_exit_73(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SLOTQ_STATE_DIR", str(blocker / "state"))
    proc = subprocess.run(slotq_cmd() + ["run", "--", "true"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 73
    _one_line_error(proc, str(blocker / "state"))


@pytest.mark.parametrize("args", [["run", "--", "true"], ["status"], ["history"], ["report", "--html", "r.html"]])
@pytest.mark.timeout(30)
def test_a_state_directory_that_is_a_file_is_named_so_and_exit_73(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    # SLOTQ_STATE_DIR naming a file: status said "Not a directory" of a slot
    # file (exit 71), history and report showed no runs (exit 0), run said
    # "cannot create state directory ...: File exists".
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SLOTQ_STATE_DIR", str(blocker))
    monkeypatch.setenv("SLOTQ_LEDGER", str(tmp_path / "ledger.sqlite"))
    proc = subprocess.run(slotq_cmd() + args, capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert proc.returncode == 73, proc.stderr
    _one_line_error(proc, f"state directory {blocker}")
    assert "not a directory" in proc.stderr and proc.stdout == "", proc.stderr
    assert blocker.read_text() == "" and not (tmp_path / "r.html").exists()


def test_a_bad_host_config_is_one_line_and_exit_78(state_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text("[pools]\nshared = -1\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(cfg))
    proc = subprocess.run(slotq_cmd() + ["run", "--", "true"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 78
    _one_line_error(proc, str(cfg))


@pytest.mark.timeout(30)
def test_a_config_you_named_that_cannot_be_used_is_refused_not_replaced_by_the_defaults(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It was ignored with a warning (which -q hid), and the run went on the
    # defaults: a budget of 60m instead of the one the file set.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    open_cfg = tmp_path / "open.toml"
    open_cfg.write_text('[defaults]\nbudget = "1s"\n')
    open_cfg.chmod(0o666)
    group_cfg = tmp_path / "group.toml"  # your own, but your group may write it: it decides your pools too
    group_cfg.write_text('[defaults]\nbudget = "1s"\n')
    group_cfg.chmod(0o664)
    for cfg, why in ((fifo, "it is not a regular file"),
                     (open_cfg, "it is writable by others (mode 0666): chmod go-w it"),
                     (group_cfg, "it is writable by others (mode 0664): chmod go-w it")):
        monkeypatch.setenv("SLOTQ_CONFIG", str(cfg))
        proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "echo", "ran"], capture_output=True, text=True,
                              timeout=20)
        assert proc.returncode == 78 and proc.stdout == "", proc.stdout
        assert proc.stderr == f"slotq run: error: cannot use host config {cfg}: {why}\n"


@pytest.mark.timeout(60)
def test_your_config_in_xdg_config_home_is_read_as_slotq_config_is(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "xdg"
    (home / "slotq").mkdir(parents=True)
    mine = home / "slotq" / "config.toml"
    mine.write_text('[defaults]\nbudget = "1s"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "sleep", "5"], capture_output=True, text=True,
                          timeout=20, cwd=tmp_path)
    assert proc.returncode == 124, proc.stderr  # its budget, 1 s
    # A $SLOTQ_CONFIG, when set, is used instead.
    named = tmp_path / "named.toml"
    named.write_text('[defaults]\nbudget = "30s"\n')
    monkeypatch.setenv("SLOTQ_CONFIG", str(named))
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "sleep", "2"], capture_output=True, text=True,
                          timeout=20, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    monkeypatch.delenv("SLOTQ_CONFIG")
    # Yours, others may not write: refused, never replaced by the defaults.
    mine.chmod(0o664)
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 78
    assert proc.stderr == (f"slotq run: error: cannot use host config {mine}: it is writable by others "
                           f"(mode 0664): chmod go-w it\n")


@pytest.mark.timeout(60)
def test_a_relative_wait_ledger_is_refused_before_anything_runs(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative, a run in a subdirectory recorded its wait where `slotq task`
    # (in the directory above) never looked: the wait was never credited.
    monkeypatch.setenv("SLOTQ_LEDGER", "ledger.sqlite")
    for cmd in (["run", "--", "echo", "ran"], ["task", "--budget", "1m", "--", "echo", "ran"], ["waits"]):
        proc = subprocess.run(slotq_cmd() + cmd, capture_output=True, text=True, timeout=20, cwd=tmp_path)
        assert proc.returncode == 78 and "ran" not in proc.stdout, (cmd, proc.stdout, proc.stderr)
        _one_line_error(proc, "SLOTQ_LEDGER must be an absolute path, not 'ledger.sqlite'")
    assert not list(tmp_path.glob("ledger.sqlite*"))


@pytest.mark.timeout(60)
def test_a_wait_ledger_that_is_a_directory_is_refused_before_anything_runs(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A directory took the runs' waits in a spool beside it, and every
    # reader failed with SQLite's "unable to open database file": `slotq
    # task` could credit no wait.
    ledger_dir = tmp_path / "ledger"
    ledger_dir.mkdir()
    monkeypatch.setenv("SLOTQ_LEDGER", str(ledger_dir))
    for cmd in (["run", "--", "echo", "ran"], ["task", "--budget", "1m", "--", "echo", "ran"], ["waits"]):
        proc = subprocess.run(slotq_cmd() + cmd, capture_output=True, text=True, timeout=20, cwd=tmp_path)
        assert proc.returncode == 78 and "ran" not in proc.stdout, (cmd, proc.stdout, proc.stderr)
        _one_line_error(proc, f"SLOTQ_LEDGER names a directory ({ledger_dir}); it is the ledger's file, "
                              f"e.g. {ledger_dir}/ledger.sqlite")
    assert list(tmp_path.iterdir()) == [ledger_dir] and not list(ledger_dir.iterdir())


@pytest.mark.timeout(60)
def test_a_credit_dir_that_is_not_a_directory_is_refused_by_run_task_and_waits_naming_why(
        state_dir: Path, tmp_path: Path) -> None:
    # A typo recorded the wait under a directory no outer runner could name
    # (`slotq task` and `slotq waits` refuse it): the wait went uncredited.
    afile = tmp_path / "afile"
    afile.write_text("")
    for bad, why in (("nosuch", "no such directory"), (str(afile), "not a directory")):
        for cmd in (["run", "--credit-dir", bad], ["task", "--budget", "1m", "--credit-dir", bad],
                    ["waits", "--dir", bad]):
            proc = subprocess.run(slotq_cmd() + cmd + ["--", "echo", "ran"] * (cmd[0] != "waits"),
                                  capture_output=True, text=True, timeout=20, cwd=tmp_path)
            assert proc.returncode == 64 and "ran" not in proc.stdout, (cmd, proc.stdout, proc.stderr)
            _one_line_error(proc, f"{cmd[-2]} {bad}: {why}")
    assert not live_tickets(state_dir) and not history_written(state_dir)


@pytest.mark.timeout(60)
def test_a_personal_config_that_resizes_the_hosts_pools_is_refused(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It read the one-slot pool as three: its run started beside the holder.
    state_dir.mkdir()
    (state_dir / "host.toml").write_text("[pools]\nshared = 1\nlanding = 1\n")
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    mine = tmp_path / "mine.toml"
    mine.write_text("[pools]\nshared = 3\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(mine))
    for cmd in (["run", "--", "echo", "beside the holder"], ["status"]):
        proc = subprocess.run(slotq_cmd() + cmd, capture_output=True, text=True, timeout=20, cwd=tmp_path)
        assert proc.returncode == 78 and "beside the holder" not in proc.stdout, (cmd, proc.stdout, proc.stderr)
        _one_line_error(proc, f"$SLOTQ_CONFIG ({mine}) gives pool 'shared' 3 slot(s), this host's own config "
                              f"({state_dir / 'host.toml'}) 1")
    # One that agrees on the sizes may set the rest (here, the budget).
    mine.write_text("[pools]\nshared = 1\n[defaults]\nbudget = \"5m\"\n")
    waiter = runs("--", "true", name="agrees")
    wait_for(lambda: "budget 5m00s" in waiter.err or len(live_tickets(state_dir)) == 1, what="the run waiting")
    gate.touch()
    assert waiter.wait() == 0 and holder.wait() == 0
    assert "budget 5m00s" in waiter.err


@pytest.mark.timeout(60)
def test_a_relative_state_dir_is_refused_for_it_would_split_the_queue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative, it named another queue in each working directory: a run
    # started in a subdirectory got "the" slot while another run held it.
    (tmp_path / "sub").mkdir()
    monkeypatch.setenv("SLOTQ_STATE_DIR", "state")
    for cmd, cwd in ((["run", "--", "true"], tmp_path), (["run", "--", "true"], tmp_path / "sub"),
                     (["status"], tmp_path)):
        proc = subprocess.run(slotq_cmd() + cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
        assert proc.returncode == 78, (cmd, proc.stderr)
        _one_line_error(proc, "SLOTQ_STATE_DIR must be an absolute path, not 'state'")
    assert not (tmp_path / "state").exists() and not (tmp_path / "sub" / "state").exists()


@pytest.mark.timeout(60)
def test_a_relative_xdg_state_home_is_ignored_as_the_xdg_spec_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLOTQ_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "xdg")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLOTQ_LEDGER", str(tmp_path / "ledger.sqlite"))
    proc = subprocess.run(slotq_cmd() + ["run", "--", "true"], capture_output=True, text=True, timeout=20,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert history_written(tmp_path / "home" / ".local" / "state" / "slotq" / "host")
    assert not (tmp_path / "xdg").exists()


@pytest.mark.timeout(60)
def test_the_per_user_default_state_is_made_private_as_the_xdg_spec_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: Start) -> None:
    # The history and the wait ledger name commands, labels and work dirs:
    # made 0755 (the umask's), every user of the machine could read them.
    for name in ("SLOTQ_STATE_DIR", "XDG_STATE_HOME", "SLOTQ_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)  # whatever the umask of whoever runs the suite
    monkeypatch.setenv("HOME", str(home))
    ledger = tmp_path / "waits" / "mine" / "l.sqlite"  # its directories made by the ledger itself
    monkeypatch.setenv("SLOTQ_LEDGER", str(ledger))
    state = home / ".local" / "state" / "slotq" / "host"
    gate = tmp_path / "gate"
    holder = runs("--", *gate_cmd(gate), name="holder")
    wait_for(lambda: (slot_holder(state) or {}).get("phase") == "running", what="the holder runs")
    waiter = runs("--", "true", name="waiter")
    wait_for(lambda: list(ledger.parent.glob("l.sqlite*")) if ledger.parent.exists() else False,
             what="the waiter's wait in the ledger")
    gate.touch()
    assert holder.wait() == 0 and waiter.wait() == 0
    proc = subprocess.run(slotq_cmd() + ["history"], capture_output=True, text=True, timeout=30)  # its index
    assert proc.returncode == 0 and proc.stdout.count("passed") == 2, proc.stdout + proc.stderr
    assert list((ledger.parent / "history-index").glob("*.sqlite"))
    made = [home / ".local", home / ".local" / "state", home / ".local" / "state" / "slotq", state,
            tmp_path / "waits", ledger.parent, ledger.parent / "history-index"]
    assert {str(d): oct(d.stat().st_mode & 0o777) for d in made} == {str(d): "0o700" for d in made}
    assert oct(home.stat().st_mode & 0o777) == "0o755"  # what was there is left as it was


@pytest.mark.timeout(120)
def test_a_run_short_of_file_descriptors_is_unavailable_in_one_line_saying_why(state_dir: Path) -> None:
    # `ulimit -n` too low for the host runner: it printed its exception's
    # repr (OSError(24, 'Too many open files')) and then "ended without a
    # result", two lines of which the second did not say why.
    seen = []
    for n in range(6, 33):
        proc = subprocess.run(["sh", "-c", f'ulimit -n {n} && exec "$@"', "sh", *slotq_cmd(), "run", "-q", "--",
                               "true"], capture_output=True, text=True, timeout=30)
        # Wherever the limit bites (start-up, state files, the runner, the command's spawn): one line saying so.
        lines = proc.stderr.splitlines()
        assert (proc.returncode, lines) == (0, []) or (
            len(lines) == 1 and "Too many open files" in lines[0] and "OSError(" not in lines[0]), (n, proc.stderr)
        seen.append(proc.stderr)
    assert any("ended without a result: it failed: Too many open files" in err for err in seen), seen
    assert any("cannot start the command: Too many open files" in err for err in seen), seen
    assert seen[-1] == ""  # and with enough of them, it runs


@pytest.mark.timeout(30)
def test_json_to_a_fifo_nobody_reads_is_refused_at_once_not_a_hang(state_dir: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = subprocess.run(slotq_cmd() + ["run", "--json", str(fifo), "-q", "--", "echo", "ran"], capture_output=True,
                          text=True, timeout=10)
    assert proc.returncode == 64 and proc.stdout == "", proc.stdout
    assert proc.stderr == f"slotq run: error: cannot write --json file {fifo}: it is a FIFO nobody reads\n"


@pytest.mark.timeout(30)
def test_a_command_that_cannot_start_fails_before_the_queue(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Behind a 20-minute line a typo waited its turn, then failed 127
    # (issue 48): now it fails at once, with the usual code and words.
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    (tmp_path / "noexec").write_text("#!/bin/sh\n")
    (tmp_path / "adir").mkdir()
    for cmd, code, says in ((["no-such-cmd"], 127, "command not found: 'no-such-cmd' (No such file or directory)"),
                            (["./noexec"], 126, "cannot execute: './noexec' (Permission denied)"),
                            (["./adir"], 126, "cannot execute: './adir' (Permission denied)")):
        for kept in ([], ["--detach"]):
            proc = subprocess.run(slotq_cmd() + ["run", "-q", *kept, "--json", str(tmp_path / "r.json"), "--", *cmd],
                                  capture_output=True, text=True, timeout=20, cwd=tmp_path, stdin=subprocess.DEVNULL)
            assert proc.returncode == code and proc.stderr.count("\n") == 1, proc.stderr
            assert says in proc.stderr and "waited 0ms, ran -" in proc.stderr, proc.stderr
            import json

            record = json.loads((tmp_path / "r.json").read_text())
            assert (record["outcome"], record["command_exit_code"], record["ticket"]) == ("failed", code, None)
            assert not live_tickets(state_dir)
    # A --prepare step may make the program: then it is looked for in its turn.
    made = runs("-q", "--prepare", "printf '#!/bin/sh\\necho made\\n' > made.sh && chmod +x made.sh", "--",
                "./made.sh", name="made")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the prepared run in line")
    gate.touch()
    assert made.wait() == 0 and made.out == b"made\n", made.err
