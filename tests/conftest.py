"""Shared helpers: a private state dir per test, the installed CLI, and
bounded wait-for-condition polling (never fixed sleeps)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from written import history_written as history_written  # (pytest-free: tests/chaos.py, run by the benchmarks, uses it too)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.host.slot import SlotLease
    from slotq.spec import RunSpec

BIN = Path(sys.executable).parent

# The tests stand in for a user's Ctrl-C by sending SIGINT to the slotq they
# started. A suite started in the background of a non-interactive shell
# (`scripts/test &`, nohup) inherits SIGINT ignored, and so would every
# slotq it starts (an ignored signal stays ignored across exec, and slotq,
# like any program, keeps it so): those tests would fail for a reason of
# the caller's shell. A handler here is reset to the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# The same for the terminal's hang-up, which the tests send too: a suite run
# under nohup inherits SIGHUP ignored. A handler that does nothing keeps the
# suite alive through a hang-up, as nohup meant, and is SIG_DFL in each child.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda signum, frame: None)


def slotq_cmd() -> list[str]:
    exe = BIN / "slotq"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("slotq")
    assert found, "slotq is not installed (pip install -e '.[test]')"
    return [found]


def reachable(run_id: str) -> bool:
    """Does the run listen for `slotq cancel` yet (its abstract socket)? A
    running command's run opens it after CONTROL_AFTER."""
    from slotq.host.control import listening

    return bool(listening(run_id))


def take_slot(state_dir: Path) -> "SlotLease":
    """The first in line leases the one slot of `shared` (default config)."""
    from slotq.config import HostConfig
    from slotq.host.hostqueue import Waiter

    lease = Waiter(str(state_dir), HostConfig(), "shared", {}).attempt()
    assert lease is not None
    return lease


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
             interval: float = 0.005) -> Any:
    """Poll `cond` until it returns something truthy; fail after `timeout`."""
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # sleep-ok: bounded polling step of wait_for


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (its SigCgt mask):
    a signal sent sooner would meet the default action, not slotq's."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (signum - 1) & 1)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single line a failing slotq command writes to stderr (never a
    traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def blocked_in_flock(pid: int) -> bool:
    """Is `pid` waiting for a flock (a `->` entry in /proc/locks)?"""
    with open("/proc/locks") as f:
        return any(line.split()[1] == "->" and line.split()[5] == str(pid) for line in f)


def fd_targets(pid: int) -> set[str]:
    """What the open descriptors of `pid` point at (`anon_inode:inotify`,
    paths, pipes)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return out


def alive(pid: int) -> bool:
    """Is `pid` a live (non-zombie) process?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    """Does any live (non-zombie) process of the group remain?"""
    from pgroup import members

    return bool(members(pgid))


# ---------------------------------------------------------------- hygiene
# The suite leaves nothing behind: no files in the system temp dir or in the
# ssh test user's home beyond what pytest's own temp dirs hold, nothing new
# or changed in the real user's own slotq state (default state dir, wait
# ledger, history index), and ssh masters live in a runtime dir of the
# session's own, ended by their control sockets (never by a pattern match on
# the process table).

_LEFTOVER_HOMES = ("/home/slotqtest",)


def _user_state_root() -> str:
    """Where slotq keeps a user's state when nothing says otherwise: its
    default state dir is <root>/host, and the default wait ledger and its
    history index sit in <root> (slotq's own default, SLOTQ_* unset)."""
    from slotq.config import state_dir_from_env

    return os.path.dirname(state_dir_from_env({k: v for k, v in os.environ.items() if not k.startswith("SLOTQ_")}))


_USER_STATE = _user_state_root()


def _user_state(root: str = _USER_STATE) -> set[str]:
    """Every path under a user's slotq state (ours by default), with its
    modification time: a file the suite made or changed there shows up as
    new."""
    out = {root} if os.path.lexists(root) else set()
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            try:
                out.add(f"{path} (modified {os.lstat(path).st_mtime_ns})")
            except OSError:
                pass
    return out


def _leftovers() -> set[str]:
    out = _user_state()
    # $TMPDIR's, and /tmp's whatever $TMPDIR says: slotq's own fallback for
    # ssh sockets (/tmp/slotq-ssh-<uid>) is there.
    for tmp in {tempfile.gettempdir(), "/tmp"}:
        for name in os.listdir(tmp):
            if name.startswith("slotq"):
                out.add(os.path.join(tmp, name))
    for home in _LEFTOVER_HOMES:
        try:
            out |= {os.path.join(home, n) for n in os.listdir(home)}  # st-*, state-*, a new .local or .cache
        except OSError:
            pass
        out |= _user_state(os.path.join(home, ".local", "state", "slotq"))  # the remote user's index, ledger
    return out


def running_with(*parts: str) -> list[str]:
    """Command lines of live processes that contain every one of `parts`
    (as `pgrep -f`, without needing procps)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                line = f.read(1 << 16).replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if line and all(p in line for p in parts):
            out.append(line)
    return out


def _commands_running() -> set[int]:
    """Pids of processes started by a slotq run (SLOTQ_RUN_ID in their
    environment), and of runs waiting away and their watchers (by their
    command lines), whoever's."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                started = b"SLOTQ_RUN_ID=" in f.read(1 << 20)
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read(1 << 16).split(b"\0")
        except OSError:
            continue
        away = argv[3:4] == [b"slotq-away"] or argv[-3:] == [b"host", b"away-gone", b""]
        if (started or away) and alive(int(name)):
            out.add(int(name))
    return out


def _described(pid: int) -> str:
    """A leftover process as the report names it: pid, run id, command
    line, parent -- enough to find the test it came from."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read(1 << 20).split(b"\0")
        run_id = next((v[len(b"SLOTQ_RUN_ID="):].decode(errors="replace") for v in env
                       if v.startswith(b"SLOTQ_RUN_ID=")), "?")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = f.read().rpartition(b")")[2].split()[1].decode()
    except (OSError, IndexError):
        return f"pid {pid} (gone by now)"
    return f"pid {pid}, run {run_id}, parent {ppid}: {line}"


_BEFORE: set[str] = set()
_BEFORE_PIDS: set[int] = set()
_RUNTIME: str | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _RUNTIME
    _BEFORE.update(_leftovers())
    _BEFORE_PIDS.update(_commands_running())
    # slotq keeps its ssh masters' sockets in $XDG_RUNTIME_DIR/slotq-ssh:
    # a dir of this session's, so that no socket is left in /tmp.
    _RUNTIME = tempfile.mkdtemp(prefix="pytest-slotq-runtime-")
    os.environ["XDG_RUNTIME_DIR"] = _RUNTIME
    # Nor is a config of the real user's ($XDG_CONFIG_HOME/slotq/config.toml) read,
    # nor the real user's private state written (a test that runs slotq's code
    # in its own process, without a ledger of its own, would: the user's
    # caches of a state dir live there).
    os.environ["XDG_CONFIG_HOME"] = os.path.join(_RUNTIME, "config")
    os.environ["XDG_STATE_HOME"] = os.path.join(_RUNTIME, "state")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _RUNTIME is not None:
        socks = os.path.join(_RUNTIME, "slotq-ssh")
        for name in os.listdir(socks) if os.path.isdir(socks) else []:
            # `ssh -O exit` asks that very master (by its socket) to end.
            subprocess.run(["ssh", "-S", os.path.join(socks, name), "-O", "exit", "x"], capture_output=True,
                           timeout=20)
        shutil.rmtree(_RUNTIME, ignore_errors=True)
    from shared_world import remove_users_code

    remove_users_code()
    end = time.monotonic() + 10  # keepers still ending a command's group, within its grace
    while _commands_running() - _BEFORE_PIDS and time.monotonic() < end:
        time.sleep(0.05)  # sleep-ok: bounded wait for the last commands to go
    procs = sorted(_commands_running() - _BEFORE_PIDS)
    if procs:
        sys.stderr.write("\nthe suite left slotq-started processes running:\n"
                         + "".join(f"  {_described(pid)}\n" for pid in procs))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    new = sorted(_leftovers() - _BEFORE)
    if new:
        sys.stderr.write("\nthe suite left these behind:\n" + "".join(f"  {p}\n" for p in new))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SLOTQ_STATE_DIR", str(d))
    monkeypatch.setenv("SLOTQ_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.delenv("SLOTQ_CONFIG", raising=False)
    return d


class Run:
    """A `slotq run` started in the background, output captured to files."""

    def __init__(self, args: list[str], tmp: Path, name: str, env: dict[str, str] | None = None) -> None:
        self.out_path = tmp / f"{name}.out"
        self.err_path = tmp / f"{name}.err"
        self.json_path = tmp / f"{name}.json"
        self.proc = subprocess.Popen(
            slotq_cmd() + ["run", "--json", str(self.json_path)] + args,
            stdin=subprocess.DEVNULL, stdout=open(self.out_path, "wb"), stderr=open(self.err_path, "wb"),
            env=env, cwd=tmp,
        )

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    @property
    def out(self) -> bytes:
        return self.out_path.read_bytes()

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def result(self) -> dict[str, Any]:
        import json

        return dict(json.loads(self.json_path.read_text()))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    started: list[Run] = []

    def start(*args: str, name: str | None = None) -> Run:
        r = Run(list(args), tmp_path, name or f"run{len(started)}")
        started.append(r)
        return r

    yield start
    for r in started:
        r.kill()


# Lines of real `slotq run`s behind a placeholder holder (the *_e2e tests,
# test_history, test_lineview, test_run_cost, test_visibility).

Start = Callable[..., "Run"]


def live_tickets(state_dir: Path, pool: str = "shared") -> list[str]:
    from slotq.host.line import list_tickets, pool_dir, probe

    return [p for _, p in list_tickets(pool_dir(str(state_dir), pool)) if probe(p)]


@contextlib.contextmanager
def slot_held_here(state_dir: Path) -> Iterator[SlotLease]:
    """shared#0 of a new state dir, held by this (live) test process; the
    holder record is the test's to write (`lease.record(...)`)."""
    from slotq.host.slot import SlotProbe

    state_dir.mkdir()
    lease = SlotProbe(str(state_dir), "shared", 1).try_lease()
    assert lease is not None
    try:
        yield lease
    finally:
        lease.release()


def slot_holder(state_dir: Path, pool: str = "shared") -> dict[str, Any] | None:
    from slotq.host.slot import read_slot

    held, info = read_slot(str(state_dir), pool, 0)
    return info if held else None


def spool_ops(ledger: str, key: str, op: str) -> list[dict[str, Any]]:
    """The wait ledger's spool events of one wait (key `run_id:kind`) and
    kind of event (open, beat, close), as the runs wrote them."""
    try:
        lines = Path(ledger + ".spool").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [e for e in map(json.loads, lines) if e.get("key") == key and e.get("op") == op]


def gate_cmd(gate: Path) -> list[str]:
    """A holder that keeps its slot until the test creates `gate`."""
    return ["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.01; done']


def start_holder(runs: Start, state_dir: Path, gate: Path, *extra: str) -> Run:
    h = runs("--label", "placeholder", *extra, "--", *gate_cmd(gate), name="holder")
    # Its record says `running` before it has left the line: until its
    # ticket is gone too, a count of tickets in line would include it.
    wait_for(lambda: (slot_holder(state_dir) or {}).get("phase") == "running" and not live_tickets(state_dir),
             what="placeholder holds the slot and has left the line")
    return h


def one_waiting_ahead(runs: Start, state_dir: Path) -> Run:
    """A quiet run in line behind the holder: the next run to come is not
    the head of the line."""
    ahead = runs("-q", "--", "true", name="ahead")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="a waiter ahead")
    return ahead


def run_in_thread(spec: RunSpec, transport: Any = None, **kw: Any) -> tuple[threading.Thread, list[Any]]:
    """`run(spec, transport or LocalTransport(), **kw)` in a thread of this
    process, started; its result lands in the list."""
    from slotq.client.caller import run
    from slotq.transports.local import LocalTransport

    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(run(spec, transport or LocalTransport(), **kw)), daemon=True)
    t.start()
    return t, results


def first_waited(state_dir: Path) -> float:
    """How long the first run in the shared line has waited so far (0: none)."""
    from slotq.host.status import waiting

    line = waiting(str(state_dir), "shared", time.time())
    return float(line[0].get("waited_s") or 0) if line else 0.0  # type: ignore[arg-type]


def line_up(runs: Start, state_dir: Path, scripts: list[str], *options: str) -> list[Run]:
    """One run per shell script (with `options`), each started once the one
    before holds its ticket: their order in line is then certain."""
    waiters = []
    for i, script in enumerate(scripts):
        waiters.append(runs(*options, "--", "sh", "-c", script, name=f"w{i}"))
        wait_for(lambda: len(live_tickets(state_dir)) == i + 1, what=f"ticket {i} in line")
    return waiters


def children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def watch_snapshots(args: list[str], count: int = 2, timeout: float = 30.0) -> tuple[int, str]:
    """Run `slotq status --watch ARGS` in a pipe until it has printed
    `count` snapshots (lines starting `--- `), then Ctrl-C it: (exit code,
    what it printed)."""
    import select

    proc = subprocess.Popen(slotq_cmd() + ["status", "--watch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    out = b""
    end = time.monotonic() + timeout
    try:
        while out.count(b"\n--- ") + out.startswith(b"--- ") < count + 1 and time.monotonic() < end:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                data = os.read(proc.stdout.fileno(), 65536)
                if not data:
                    break
                out += data
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=10)
    return proc.returncode, (out + rest).decode(errors="replace")


# Helpers of the supervision, cancel and admission tests (test_supervision_e2e,
# test_cancel_admission).

def holder_record(state_dir: Path) -> dict[str, Any]:
    """The holder record once its keeper completed it (with the command's
    pid) and the holder has left the line: later tickets are others'."""
    rec: dict[str, Any] = wait_for(lambda: (slot_holder(state_dir) or {}).get("cmd") and not live_tickets(state_dir)
                                   and slot_holder(state_dir), what="the holder record with its command")
    return rec


def status_json() -> dict[str, Any]:
    proc = subprocess.run(slotq_cmd() + ["status", "--json"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


@pytest.fixture
def shared_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir two users can use (a world-writable temp dir of our own),
    and the second user's slotq: the ssh test user's (scripts/test)."""
    home = os.environ.get("SLOTQ_TEST_SSH_USER_HOME")
    if os.getuid() != 0 or not home or not shutil.which("runuser"):
        pytest.skip("needs root and the second test user (scripts/test creates it)")
    root = Path(tempfile.mkdtemp(prefix="slotq-2users-"))
    try:
        os.chmod(root, 0o777)
        state = root / "state"
        for d in (state, state / "slots", state / "tickets", state / "tickets" / "shared"):
            d.mkdir()
            os.chmod(d, 0o1777)
        monkeypatch.setenv("SLOTQ_STATE_DIR", str(state))
        monkeypatch.setenv("SLOTQ_LEDGER", str(root / "ledger.sqlite"))
        yield state
    finally:
        shutil.rmtree(root, ignore_errors=True)


def second_user_slotq() -> list[str]:
    return [os.path.join(os.environ["SLOTQ_TEST_SSH_USER_HOME"], "venv", "bin", "slotq")]


from remote_host import remote, ssh_config  # noqa: E402,F401  (fixtures of the ssh tests, for every test file)
from slurm_world import slurm_env  # noqa: E402,F401  (the Slurm tests' fixture)
