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
    max_wait: give up after this long in line (`not_admitted`); None = wait.
    """

    __slots__ = ("argv", "cls", "budget", "prepare", "prepare_timeout", "label",
                 "report_every", "kill_grace", "cwd", "env", "run_id", "work_id", "max_wait")

    # What travels to a remote runner (`slotq host run --request-stdin`).
    _REQUEST = ("argv", "cls", "budget", "prepare", "prepare_timeout", "label", "report_every",
                "kill_grace", "run_id", "work_id", "cwd", "max_wait")

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
        work_id: str | None = None,
        max_wait: float | None = None,
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
        self.work_id = work_id  # a synced work dir on a remote host (instead of cwd)
        self.max_wait = max_wait

    def to_request(self) -> bytes:
        """One JSON line. Arguments are JSON strings: no shell sees them."""
        import json

        return json.dumps({k: getattr(self, k) for k in self._REQUEST}).encode() + b"\n"

    @classmethod
    def from_request(cls, line: bytes) -> "RunSpec":
        """Parse `to_request`'s line; ValueError if it is not one."""
        import json

        data = json.loads(line)
        if not isinstance(data, dict) or not isinstance(data.get("argv"), list) or not data["argv"] \
                or not all(isinstance(a, str) for a in data["argv"]):
            raise ValueError("a run request needs a non-empty argv of strings")
        unknown = set(data) - set(cls._REQUEST)
        if unknown:
            raise ValueError(f"unknown request field(s) {sorted(unknown)}")
        argv = data.pop("argv")
        return cls(argv, **data)


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
