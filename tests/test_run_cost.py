"""What a run costs the process that makes it: the modules a run that
gets its slot at once imports (and the ones a run that waits adds), the
garbage collector's state, and what in-process runs leave behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Start, slotq_cmd, start_holder, wait_for
from slotq.client.caller import run
from slotq.spec import RunSpec
from slotq.transports.local import LocalTransport

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(30)
def test_the_launcher_scripts_install_writes_starts_slotq_without_site(state_dir: Path, tmp_path: Path) -> None:
    # `site` is about 1.5 ms of every run and slotq needs nothing it adds.
    launcher = tmp_path / "slotq"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "write_launcher.py"), str(ROOT / "bin" / "slotq"),
                    str(launcher), str(tmp_path / "run.bundle")], check=True, timeout=20)
    assert launcher.read_text().splitlines()[0] == f"#!{os.path.abspath(sys.executable)} -S"
    assert f"BUNDLE = {str(tmp_path / 'run.bundle')!r}" in launcher.read_text().splitlines()
    # The command's parent is the run's keeper, a fork of the slotq process:
    # its command line is the one slotq was started with.
    out = subprocess.run([str(launcher), "run", "-q", "--", "sh", "-c", "tr '\\0' ' ' < /proc/$PPID/cmdline"],
                         capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:3] == [os.path.abspath(sys.executable), "-S", str(launcher)], out.stdout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", [["bin/slotq"], ["-m", "slotq"]])
def test_ctrl_c_while_slotq_starts_is_a_cancel_without_a_traceback(tmp_path: Path, how: list[str]) -> None:
    # A Ctrl-C (or a harness's SIGINT) that comes while the launcher still
    # imports slotq: there is nothing to clean up yet, so exit 130 as a
    # cancel does. A stand-in for the package on PYTHONPATH (ahead of the
    # launcher's own path) makes the signal come during that import.
    fake = tmp_path / "fake" / "slotq" / "cli"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake.parent / "__main__.py").write_text((ROOT / "src" / "slotq" / "__main__.py").read_text())
    (fake / "__init__.py").write_text("import os\nos.kill(os.getpid(), 2)\nimport time\ntime.sleep(10)\n")
    argv = [sys.executable, "-S", *([str(ROOT / how[0])] if how[0] == "bin/slotq" else how), "run", "--", "true"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path / "fake")))
    assert (out.returncode, out.stderr) == (130, "")


def test_an_uncontended_run_imports_no_heavy_module_in_the_caller(state_dir: Path, tmp_path: Path) -> None:
    # Each of these costs milliseconds per run (json and enum pull in re);
    # the run path must not need them. A regression here showed up as a
    # third more per-call cost in benchmarks/.
    probe = ("import sys\nfrom slotq.cli import main\ncode = main(['run', '-q', '--', 'true'])\n"
             "heavy = ('re', 'json', 'enum', 'sqlite3', 'tomllib', 'argparse', 'subprocess', 'warnings', '_socket',\n"
             "         '_json', 'slotq.client.ledger')\n"
             "print(code, sorted(m for m in heavy if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.stdout.strip() == "0 []", out.stdout + out.stderr


@pytest.mark.timeout(60)
def test_a_run_that_waits_reads_with_the_c_json_scanner(runs: Start, state_dir: Path, tmp_path: Path) -> None:
    # Once a run waits it reads other users' records, the history and its
    # reports: with the standard library's C scanner, not the hand-written
    # parser that serves an uncontended run's start (records.py).
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    probe = ("import sys\nfrom slotq import records\nfrom slotq.cli import main\n"
             "code = main(['run', '--', 'true'])\n"
             "print(code, records._scan is not None, 're' in sys.modules)\n")
    proc = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, stdin=subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        while "waiting" not in proc.stderr.readline():  # its first report: it waits
            assert proc.poll() is None, "the run ended without waiting"
        gate.touch()
        out, _ = proc.communicate(timeout=30)
        assert out.strip() == "0 True False", out
        assert holder.wait(timeout=20) == 0
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(30)
def test_garbage_collection_is_off_only_while_a_run_starts(state_dir: Path, tmp_path: Path) -> None:
    # bin/slotq turns the collector off (collections over the import-time
    # objects cost ~1 ms a run); a run turns it back on, frozen, once its
    # command starts, and every other command at once (`status --watch`
    # runs for hours).
    script = Path(slotq_cmd()[0]).read_text()
    assert "gc.disable()" in script.split("from slotq.cli import main")[0]
    probe = ("import gc, sys\ngc.disable()\nfrom slotq.cli import main\n"
             "code = main(sys.argv[1:])\nprint(code, gc.isenabled(), gc.get_freeze_count() > 0)\n")
    for args, frozen in ((["run", "-q", "--", "true"], "True"), (["status"], "False")):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=30,
                             cwd=tmp_path)
        assert out.stdout.strip().splitlines()[-1] == f"0 True {frozen}", (args, out.stdout + out.stderr)


@pytest.mark.timeout(30)
def test_in_process_runs_leave_no_descriptor_thread_or_child_behind(state_dir: Path, tmp_path: Path) -> None:
    # The host side runs in a thread of the caller: a library caller making
    # many runs must not collect descriptors, threads or zombies.
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def tasks() -> int:
        return len(os.listdir("/proc/self/task"))

    out_r, out_w = os.pipe()
    spec = RunSpec(["true"], budget=30, cwd=str(tmp_path))
    assert run(spec, LocalTransport(), stdout_fd=out_w).outcome.value == "passed"  # warm: lazy imports
    # A run's thread releases the caller just before it returns (at nice
    # 10, its bookkeeping done): it is gone a moment later.
    wait_for(lambda: tasks() == 1, timeout=2, what="the warm run's thread to end")
    before = fds()
    for _ in range(5):
        assert run(RunSpec(["sh", "-c", "echo hi"], budget=30, cwd=str(tmp_path)), LocalTransport(),
                   stdout_fd=out_w).outcome.value == "passed"
    wait_for(lambda: tasks() == 1, timeout=2, what="the last run's thread to end")
    assert fds() == before
    assert os.read(out_r, 100) == b"hi\n" * 5
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)
    os.close(out_r)
    os.close(out_w)
