"""What to run and how: the request a client hands to a host runner."""

from __future__ import annotations

import os


def new_run_id() -> str:
    return os.urandom(6).hex()


class RunSpec:
    """One run's request.

    argv: the command, exactly as given (never through a shell).
    cls: run class (mapped to a pool by the host config).
    budget: seconds the command may run once started; None = host default.
    prepare: shell command run after the slot is leased, before the command.
    prepare_timeout: its own limit; None = host default.
    kill_grace: TERM -> KILL grace when stopping; None = host default.
    report_every: seconds between queue status events.
    """

    __slots__ = ("argv", "cls", "budget", "prepare", "prepare_timeout", "label",
                 "report_every", "kill_grace", "cwd", "env", "run_id")

    def __init__(
        self,
        argv: list[str],
        *,
        cls: str = "shared",
        budget: float | None = None,
        prepare: str | None = None,
        prepare_timeout: float | None = None,
        label: str | None = None,
        report_every: float = 30.0,
        kill_grace: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.cls = cls
        self.budget = budget
        self.prepare = prepare
        self.prepare_timeout = prepare_timeout
        self.label = label or _default_label(argv)
        self.report_every = report_every
        self.kill_grace = kill_grace
        self.cwd = cwd
        self.env = env
        self.run_id = run_id or new_run_id()


def _default_label(argv: list[str]) -> str:
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    if not user:
        import pwd

        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = str(os.getuid())
    cmd = " ".join(argv)
    if len(cmd) > 40:
        cmd = cmd[:37] + "..."
    return f"{user}: {cmd}"
