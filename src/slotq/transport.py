"""Transports: how a client reaches a host runner.

The local transport runs the host side in a forked child -- no second Python
interpreter to start -- and talks to it over two pipes, exactly as a remote
runner is talked to over ssh: the same framed stream, and the same liveness
rule (the runner's stdin closing means the caller is gone).
"""

from __future__ import annotations

import os
import signal
import sys

from .client import Transport
from .config import HostConfig
from .spec import RunSpec


class LocalTransport(Transport):
    """This machine is the host."""

    def __init__(self, state_dir: str | None = None, config: HostConfig | None = None) -> None:
        from .config import state_dir_from_env

        self.state_dir = state_dir or state_dir_from_env()
        self.config = config or HostConfig.load(state_dir=self.state_dir)
        self.host = os.uname().nodename
        self.pid = 0

    def start(self, spec: RunSpec) -> tuple[int, int]:
        ctl_r, ctl_w = os.pipe()
        ev_r, ev_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(ctl_w)
                os.close(ev_r)
                # Do not hold the caller's stdin/stdout: a reader of the
                # caller's output must see EOF when the caller is gone.
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.close(devnull)
                from .runner import HostRunner

                HostRunner(spec, state_dir=self.state_dir, config=self.config,
                           in_fd=ctl_r, out_fd=ev_w).run()
                code = 0
            except BaseException as e:  # never return into the caller's code
                try:
                    sys.stderr.write(f"slotq: host runner failed: {e!r}\n")
                    sys.stderr.flush()
                except BaseException:
                    pass
            finally:
                os._exit(code)
        os.close(ctl_r)
        os.close(ev_w)
        self.pid = pid
        return ctl_w, ev_r

    def kill(self) -> None:
        # The runner went silent: SIGKILL it; its keeper then ends the
        # command's group (PDEATHSIG) and the slot is released.
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> str:
        if self.pid:
            os.waitpid(self.pid, 0)
            self.pid = 0
        return ""
