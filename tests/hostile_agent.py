"""The hostile member's hands (issue 65): run as user B, it does what B
can do to a shared pool, one act at a time as the generative test asks
(tests/test_hostile.py), and holds what it took -- locks, tickets, slots,
sockets, stopped runs of its own -- until told to let go.

    python hostile_agent.py        (acts as JSON lines on stdin, one answer line each)

Standard library only (it runs as another user, from anywhere). Every act
answers {"ok": true} or {"ok": false, "error": ...}: a refusal (B may not
write there) is an answer, not a failure -- trying is the attack."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time


class Agent:
    def __init__(self) -> None:
        self.held: dict[str, list[object]] = {}  # tag -> descriptors, sockets, processes

    def keep(self, tag: str, thing: object) -> None:
        self.held.setdefault(tag, []).append(thing)

    # ------------------------------------------------------------ files
    def write(self, path: str, data: str, how: str = "trunc", offset: int = 0, mode: int = 0o644,
              b64: bool = False) -> None:
        raw = base64.b64decode(data) if b64 else data.encode()
        flags = os.O_WRONLY | os.O_CREAT | {"trunc": os.O_TRUNC, "append": os.O_APPEND, "pwrite": 0}[how]
        fd = os.open(path, flags, mode)
        try:
            if how == "pwrite":
                os.pwrite(fd, raw, offset)
            else:
                os.write(fd, raw)
        finally:
            os.close(fd)

    def sparse(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def flood(self, dir: str, pattern: str, start: int, n: int) -> None:
        for i in range(start, start + n):
            try:
                os.close(os.open(os.path.join(dir, pattern % i), os.O_WRONLY | os.O_CREAT, 0o644))
            except OSError:
                pass

    def symlink(self, target: str, path: str) -> None:
        os.symlink(target, path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, 0o700)

    def mkfifo(self, path: str) -> None:
        os.mkfifo(path, 0o666)

    def hardlink(self, src: str, path: str) -> None:
        os.link(src, path)

    def utime(self, path: str, t: float) -> None:
        os.utime(path, (t, t))

    def remove(self, path: str) -> None:
        os.unlink(path)

    # ------------------------------------------------------------ held things
    def lock(self, path: str, tag: str, how: str = "ex") -> None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if how == "ex" else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        self.keep(tag, fd)

    def tickets(self, pdir: str, seq_path: str, n: int, content: str, tag: str, number: str = "next",
                counter: bool = True) -> None:
        """`n` tickets taken as slotq takes one (the counter locked, a temp
        locked, then linked to its number) and held, never claiming.
        `number`: next (above the line: microseconds, as slotq numbers),
        low (ahead of everyone), last (10^18 - 1 down)."""
        seq_fd = os.open(seq_path, os.O_RDWR)
        try:
            if counter:
                fcntl.flock(seq_fd, fcntl.LOCK_EX)
            base = {"next": time.time_ns() // 1000, "low": 1, "last": 10**18 - 1 - n}[number]
            names = {x for x in os.listdir(pdir)}
            done = 0
            seq = base
            while done < n:
                seq += 1
                name = "%016d.t" % seq
                if name in names:
                    continue
                tmp = os.path.join(pdir, ".b%d.%d.tmp" % (seq, os.getpid()))
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, content.encode())
                try:
                    os.link(tmp, os.path.join(pdir, name))
                except FileExistsError:
                    os.close(fd)
                    continue
                finally:
                    os.unlink(tmp)
                self.keep(tag, fd)
                done += 1
            if counter:
                os.pwrite(seq_fd, b"%020d\n" % seq, 0)
        finally:
            os.close(seq_fd)

    def slot(self, path: str, record: str, tag: str) -> None:
        """A free slot taken by hand, a record of B's choosing written in it."""
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        data = record.replace("$PID", str(os.getpid())).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        self.keep(tag, fd)

    def bind(self, name: str, tag: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(b"\0" + name.encode())
        s.listen(1)
        self.keep(tag, s)

    def run_stopped(self, pdir: str, tag: str) -> None:
        """A real `slotq run` of B's, stopped (SIGSTOP) once it is in line."""
        before = set(os.listdir(pdir))
        p = subprocess.Popen([sys.executable, "-m", "slotq", "run", "-q", "--label", "b-stopped", "--", "true"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if [n for n in set(os.listdir(pdir)) - before if n.endswith(".t")]:
                break
            if p.poll() is not None:
                raise OSError(0, f"B's run ended at once ({p.returncode})")
            time.sleep(0.01)  # sleep-ok: polling for B's own run's ticket
        for pid in self._session(p.pid):
            os.kill(pid, signal.SIGSTOP)
        self.keep(tag, p)

    @staticmethod
    def _session(sid: int) -> list[int]:
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        if int(f.read().rsplit(b")", 1)[1].split()[4]) == sid:
                            out.append(int(name))
                except (OSError, IndexError, ValueError):
                    pass
        return out

    def release(self, tag: str) -> None:
        for thing in self.held.pop(tag, []):
            if isinstance(thing, int):
                os.close(thing)
            elif isinstance(thing, subprocess.Popen):
                for pid in self._session(thing.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                thing.wait()
            else:
                thing.close()  # type: ignore[attr-defined]

    def release_all(self) -> None:
        for tag in list(self.held):
            self.release(tag)


def main() -> None:
    agent = Agent()
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        act = json.loads(line)
        op = act.pop("op")
        try:
            getattr(agent, op)(**act)
            answer: dict[str, object] = {"ok": True}
        except (OSError, ValueError) as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)
    agent.release_all()


if __name__ == "__main__":
    main()
