"""The tools under comparison, behind one interface: how to start a caller
of each (`argv`), how many wait (`queued`), which processes count as
waiting, and how to tear a scenario down. Anchors: flock(1) (util-linux),
GNU parallel's `sem`, task-spooler (`tsp`); and slotq itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
# Another build's launcher to measure in place of this checkout's (an A/B of
# two commits in the same hour: docs/performance.md). Its tickets must be
# readable by this checkout's slotq.host.line (Slotq.queued).
SLOTQ = os.environ.get("SLOTQ_BENCH_SLOTQ") or str(VENV_BIN / "slotq")
PYTHON = str(VENV_BIN / "python")


def proc_cpu(pid: int) -> float:
    """CPU seconds one process has run, to the nanosecond (the scheduler's
    own sum, /proc/PID/schedstat); where that file is missing, utime +
    stime (`proc_cpu_ticks`). A waiter's wake-up takes well under a
    millisecond, and utime/stime come in clock ticks (10 ms): over a
    window, each of a thousand waiters then counts 0 or 10 ms."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return proc_cpu_ticks(pid)


def proc_cpu_ticks(pid: int) -> float:
    """utime + stime of one process, in seconds (clock-tick resolution)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError):
        return 0.0


def busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (user, nice,
    system, irq, softirq: not idle, iowait or another guest's steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def settle(cap: float = 10.0, window: float = 0.3, busy: float = 0.1) -> float:
    """Wait until the machine is quiet -- under `busy` of one core over
    `window`, this process's own polling included -- or `cap` seconds have
    passed; the seconds waited. Before every repetition of every tool, and
    in a hand-over with the line in place before the holder lets go: what
    is measured is then the tool's own work, not the leftovers of the one
    before (a thousand callers' bookkeeping) nor a line still forming
    (slotq's waiters make their first report and fork their keepers once
    in line; a line of 500 takes a few seconds of CPU to get there, and a
    real line forms over minutes). `sem`'s waiters poll for as long as they
    wait: a line of them is never quiet (Tool.quiet_line)."""
    t0 = time.monotonic()
    prev = busy_s()
    while True:
        time.sleep(window)
        now = busy_s()
        if now - prev <= busy * window or time.monotonic() - t0 >= cap:
            return time.monotonic() - t0
        prev = now


def remove_work(work: Path | str, timeout: float = 10.0) -> None:
    """Remove a scenario's work dir once no process uses it any more (none
    has it in its environment): a run killed at teardown has a keeper, in a
    session of its own, that closes its wait record in the work dir's
    ledger a moment later -- and would make the dir again after an early
    removal (found left behind in /tmp after a full run)."""
    needle = os.fsencode(str(work))
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        users = False
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        users = needle in f.read()
                except OSError:
                    continue
                if users:
                    break
        if not users:
            break
        time.sleep(0.05)
    shutil.rmtree(work, ignore_errors=True)


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:  # each thread's own children: slotq forks keepers from its runner thread
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                pass
    return out


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


class Tool:
    name = "?"
    quiet_line = True  # a line of its waiters goes quiet once formed (settle() can wait for it)

    def __init__(self, work: Path, slots: int = 1) -> None:
        self.work = work
        self.slots = slots
        self.procs: list[subprocess.Popen[bytes]] = []
        self.n = 0

    def argv(self, shell_cmd: str, label: str = "") -> list[str]:
        """The caller's command line; `label` names it where the tool can."""
        raise NotImplementedError

    def start(self, shell_cmd: str, label: str = "") -> subprocess.Popen[bytes]:
        p = subprocess.Popen(self.argv(shell_cmd, label), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=self.env(), cwd=self.work)
        self.procs.append(p)
        self.n += 1
        return p

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def queued(self) -> int:
        raise NotImplementedError

    def all_exited(self) -> bool:
        """Every caller process has ended (then nothing more will start)."""
        return all(p.poll() is not None for p in self.procs)

    def waiting_pids(self) -> list[int]:
        """Processes whose CPU counts as 'waiting' (all but the holder's)."""
        pids: list[int] = []
        for p in self.procs[1:]:
            if p.poll() is None:
                pids += descendants(p.pid)
        return pids

    def holder_process(self, command_pid: int) -> int:
        """The process that holds the slot for the command `command_pid`."""
        return parent_of(command_pid)

    def teardown(self) -> None:
        try:
            (self.work / "gate").touch()  # a holder still looping on its gate ends too
        except OSError:
            pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


class Flock(Tool):
    name = "flock"

    def argv(self, shell_cmd: str, label: str = "") -> list[str]:
        # Several slots: callers take lock files round-robin (flock has no
        # counting semaphore; this is what people script around it).
        lock = self.work / f"lock.{self.n % self.slots}"
        return ["flock", str(lock), "sh", "-c", shell_cmd]

    def queued(self) -> int:
        inodes = set()
        for i in range(self.slots):
            try:
                inodes.add(os.stat(self.work / f"lock.{i}").st_ino)
            except FileNotFoundError:
                pass
        n = 0
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            if "->" in parts and parts[-3].split(":")[-1].isdigit() and int(parts[-3].split(":")[-1]) in inodes:
                n += 1
        return n


class Slotq(Tool):
    name = "slotq"

    def __init__(self, work: Path, slots: int = 1) -> None:
        super().__init__(work, slots)
        self.state = work / "state"
        cfg = work / "host.toml"
        cfg.write_text(f"[pools]\nshared = {slots}\nlanding = 1\n")
        self.cfg = cfg

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e.update(SLOTQ_STATE_DIR=str(self.state), SLOTQ_CONFIG=str(self.cfg),
                 SLOTQ_LEDGER=str(self.work / "ledger.sqlite"))
        return e

    def argv(self, shell_cmd: str, label: str = "") -> list[str]:
        return [SLOTQ, "run", "-q", "--kill-grace", "1", *(["--label", label] if label else []),
                "--", "sh", "-c", shell_cmd]

    def queued(self) -> int:
        sys.path.insert(0, str(REPO / "src"))
        from slotq.host.line import list_tickets, pool_dir, probe

        return sum(1 for _, p in list_tickets(pool_dir(str(self.state), "shared")) if probe(p))

    def line(self) -> list[str]:
        """The labels of the runs in the shared line, in line order (the
        host's ticket numbers): the order slotq promises to start them in."""
        sys.path.insert(0, str(REPO / "src"))
        from slotq.host.line import list_tickets, pool_dir, read_info

        return [str((read_info(p) or {}).get("label")) for _, p in list_tickets(pool_dir(str(self.state), "shared"))]

    def holder_process(self, command_pid: int) -> int:
        # command <- keeper <- the caller's process (the host side is a thread of it)
        return parent_of(parent_of(command_pid))


class Sem(Tool):
    name = "sem"
    quiet_line = False  # its waiters poll with back-off for as long as they wait

    def __init__(self, work: Path, slots: int = 1) -> None:
        super().__init__(work, slots)
        self.id = f"slotqbench{os.getpid()}{time.monotonic_ns()}"
        (work / "parallel-home").mkdir(exist_ok=True)

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e["PARALLEL_HOME"] = str(self.work / "parallel-home")
        return e

    def argv(self, shell_cmd: str, label: str = "") -> list[str]:
        # sem hands its arguments to a shell as one command line.
        return ["sem", "--fg", "--will-cite", "--id", self.id, "-j", str(self.slots), shell_cmd]

    def queued(self) -> int:
        # sem has no queue to ask: count live sem processes beyond the holder.
        return sum(1 for p in self.procs[1:] if p.poll() is None)


class Tsp(Tool):
    name = "task-spooler"

    def __init__(self, work: Path, slots: int = 1) -> None:
        super().__init__(work, slots)
        self.socket = str(work / "tsp.socket")
        subprocess.run(["tsp", "-S", str(slots)], env=self.env(), stdout=subprocess.DEVNULL, check=True)

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e.update(TS_SOCKET=self.socket, TS_MAXFINISHED="2000", TS_MAXCONN="2000", TMPDIR=str(self.work))
        return e

    def argv(self, shell_cmd: str, label: str = "") -> list[str]:
        return ["tsp", "-n", "sh", "-c", shell_cmd]  # -n: no output file

    def queued(self) -> int:
        try:
            out = subprocess.run(["tsp", "-l"], env=self.env(), capture_output=True, text=True, timeout=10).stdout
        except subprocess.TimeoutExpired:
            return 0  # its server does not answer (a thousand clients): the caller's wait times out
        return sum(1 for line in out.splitlines()[1:] if " queued " in f" {line} ")

    def server_pid(self) -> int | None:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
                    env = Path(f"/proc/{d}/environ").read_bytes()
                except OSError:
                    continue
                if cmd and cmd[0].endswith(b"tsp") and self.socket.encode() in env and parent_of(int(d)) == 1:
                    return int(d)
        return None

    def all_exited(self) -> bool:
        return False  # the callers only enqueue; the server runs the jobs

    def waiting_pids(self) -> list[int]:
        pid = self.server_pid()
        return [pid] if pid else []

    def teardown(self) -> None:
        subprocess.run(["tsp", "-K"], env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        super().teardown()


TOOLS = {"slotq": Slotq, "flock": Flock, "sem": Sem, "task-spooler": Tsp}
