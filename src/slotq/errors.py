"""Exceptions: for misuse and failures only. Expected endings are `Outcome`s.

Every exception slotq raises derives from `SlotqError` and carries the facts
(path, host, run id) as attributes, plus the exit code the CLI uses for it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `from typing import ...`: errors.py is on every run's path
if TYPE_CHECKING:
    from typing import Callable, TypeVar

    T = TypeVar("T")


def shown(text: str, limit: int = 40) -> str:
    """A value the user gave, quoted for a one-line error, cut at `limit`
    characters (a 5000-character mistake must not fill the terminal)."""
    return repr(text) if len(text) <= limit else repr(text[:limit - 3] + "...")


class SlotqError(Exception):
    """Base class. `exit_code` is what the CLI exits with when this escapes."""

    exit_code = 1


class UsageError(SlotqError):
    """A bad argument: unknown class, garbled duration, no command."""

    exit_code = 64  # EX_USAGE (sysexits): never 2, which make and pytest exit with


class ConfigError(SlotqError):
    """The host config file cannot be read or makes no sense."""

    exit_code = 78  # EX_CONFIG

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDirError(SlotqError):
    """The host's state directory cannot be created or written."""

    exit_code = 73  # EX_CANTCREAT

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class OutputError(SlotqError):
    """What a command prints, or the file it writes, cannot be written (a
    full disk, an I/O error): its whole result is lost. Not a reader that
    went away (`| head`): that ends quietly."""

    exit_code = 74  # EX_IOERR

    @classmethod
    def guard(cls, call: Callable[..., T], *args: object) -> T:
        """`call(*args)`, a write to stdout: a reader gone stays
        BrokenPipeError (quiet), any other failure is OutputError."""
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise cls(f"cannot write the output (stdout): {e.strerror or e}") from None


class WorkTreeError(SlotqError):
    """A file of the caller's own work tree cannot be read, so a remote run
    cannot send it (a root-owned build artefact, a private directory): the
    caller's to fix, never the host's fault."""

    exit_code = 66  # EX_NOINPUT: an input file did not exist or was not readable


class NoSuchRun(SlotqError):
    """No such run of yours here (attach, cancel): neither live nor in the
    history."""

    exit_code = 66  # EX_NOINPUT, as `slotq cancel` says it


class AdmissionRefused(SlotqError):
    """The host's admission policy turned a run away (a named policy, never
    a timeout). A run reports it as `not_admitted`."""

    exit_code = 117


class ProtocolError(SlotqError):
    """The runner's stream is not what this version of slotq speaks."""

    exit_code = 121  # reported as `unavailable`


class HostUnavailable(SlotqError):
    """A host could not be reached or used (unreachable, auth failure, no
    slotq there, transfer failed). A run reports it as `unavailable`."""

    exit_code = 121

    def __init__(self, message: str, host: str) -> None:
        super().__init__(message)
        self.host = host
