"""Child processes for the ssh transport without `subprocess`.

`subprocess` imports `locale`, and with it `re` and `enum`: about 7 ms of
every remote run's start-up, a tenth of the whole run (benchmarks/: a run
against raw ssh + rsync). A remote run needs only this: spawn a program
with given descriptors (posix_spawn: no Python between fork and exec),
wait for it with a timeout, or run it and collect its output.
"""

from __future__ import annotations

import os
import select
import time

from .. import signals as signal

# The programs started here and not yet waited for (end_all: a stop signal
# while threads wait for them).
_running: set["Proc"] = set()
_ended = False


def end_all() -> None:
    """Kill every program started here that is still running, and refuse
    to start more: the threads waiting for them (the status of several
    hosts, asked at once) then return at once. For a process about to end."""
    global _ended
    _ended = True
    for proc in list(_running):
        proc.kill()


class Proc:
    """A started program. `stdin`/`stdout`/`stderr`: descriptors to give
    it (None: /dev/null); `keep`: more, {its number: ours}. Ours are
    close-on-exec, so it inherits nothing else. FileNotFoundError if the
    program is not on PATH."""

    def __init__(self, argv: list[str], stdin: int | None = None, stdout: int | None = None,
                 stderr: int | None = None, keep: dict[int, int] | None = None) -> None:
        if _ended:
            raise InterruptedError(f"not starting {argv[0]}: slotq is being stopped")
        # A stop signal's exception must not come between the program's start
        # and our note of it: that program would be left running (an ssh
        # left connecting). The stop signals wait from before the spawn
        # until it is noted; the program starts with our mask as it was.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.STOPS)
        try:
            devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                actions = [(os.POSIX_SPAWN_DUP2, devnull if fd is None else fd, target)
                           for target, fd in ((0, stdin), (1, stdout), (2, stderr), *(keep or {}).items())]
                self.pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions, setsigmask=mask)
            finally:
                os.close(devnull)
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
        self.returncode: int | None = None
        _running.add(self)
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a stop that came meanwhile is handled here
        except BaseException:  # its exception: the run this program was for is ending
            self.kill()
            self.wait()
            raise

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._reaped(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (-N: killed by signal N); TimeoutError past `timeout`."""
        if self.returncode is not None:
            return self.returncode
        if timeout is None:
            return self._reaped(os.waitpid(self.pid, 0)[1])
        fd = os.pidfd_open(self.pid)
        try:
            if not select.select([fd], [], [], max(0.0, timeout))[0]:
                raise TimeoutError(f"{self.pid} still running after {timeout:g}s")
        finally:
            os.close(fd)
        return self._reaped(os.waitpid(self.pid, 0)[1])

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        _running.discard(self)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


def run(argv: list[str], timeout: float, limit: int = 1 << 20,
        keep: dict[int, int] | None = None) -> tuple[int, bytes, bytes]:
    """Run a program with no input: (exit code, stdout, stderr), each kept
    to its last `limit` bytes. Past `timeout` it is killed: TimeoutError.
    `keep`: more descriptors to give it (Proc)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    streams = {out_r: "out", err_r: "err"}
    data = {"out": bytearray(), "err": bytearray()}
    end = time.monotonic() + timeout
    proc = None
    try:
        try:
            proc = Proc(argv, stdout=out_w, stderr=err_w, keep=keep)
        finally:
            os.close(out_w)
            os.close(err_w)
        while streams:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{argv[0]} did not finish within {timeout:g}s")
            for fd in select.select(list(streams), [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if chunk:
                    buf = data[streams[fd]]
                    buf += chunk
                    if len(buf) >= 2 * limit:  # trimmed now and then: linear, not a copy per chunk
                        del buf[:-limit]
                else:
                    os.close(fd)
                    del streams[fd]
    except BaseException:  # our timeout, or a stop signal's exception (caller.py): the program goes too
        if proc is not None:
            proc.kill()
            proc.wait()
        raise
    finally:
        for fd in streams:
            os.close(fd)
    return proc.wait(max(0.1, end - time.monotonic())), bytes(data["out"][-limit:]), bytes(data["err"][-limit:])
