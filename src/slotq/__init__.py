"""slotq: run a verification command on a shared test machine through a fair
slot queue whose clocks time the right thing.

The public API is re-exported here lazily, so that `import slotq` (and the
CLI's start-up) pays only for what a command uses.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `from typing import ...`: keeps start-up lean

__version__ = "0.2.0"

_EXPORTS = {
    "Outcome": "slotq.outcome",
    "exit_code_for": "slotq.outcome",
    "EXIT_CODES": "slotq.outcome",
    "RunSpec": "slotq.spec",
    "Deadline": "slotq.client.deadline",
    "Extension": "slotq.client.deadline",
    "Ledger": "slotq.client.ledger",
    "Credit": "slotq.client.ledger",
    "run_task": "slotq.client.task",
    "TaskResult": "slotq.client.task",
    "RunResult": "slotq.client.result",
    "run": "slotq.client.api",
    "call": "slotq.client.caller",
    "submit": "slotq.client.kept",
    "submit_async": "slotq.client.kept",
    "KeptRun": "slotq.client.kept",
    "Clock": "slotq.clock",
    "FakeClock": "slotq.clock",
    "Timer": "slotq.clock",
    "HostConfig": "slotq.config",
    "parse_duration": "slotq.durations",
    "SlotqError": "slotq.errors",
    "UsageError": "slotq.errors",
    "ConfigError": "slotq.errors",
    "StateDirError": "slotq.errors",
    "ProtocolError": "slotq.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from typing import Any

    from .client.api import run as run
    from .client.caller import call as call
    from .client.result import RunResult as RunResult
    from .client.deadline import Deadline as Deadline, Extension as Extension
    from .client.kept import KeptRun as KeptRun, submit as submit, submit_async as submit_async
    from .client.ledger import Credit as Credit, Ledger as Ledger
    from .client.task import TaskResult as TaskResult, run_task as run_task
    from .clock import Clock as Clock, FakeClock as FakeClock, Timer as Timer
    from .config import HostConfig as HostConfig
    from .durations import parse_duration as parse_duration
    from .errors import ConfigError as ConfigError, ProtocolError as ProtocolError, SlotqError as SlotqError
    from .errors import StateDirError as StateDirError, UsageError as UsageError
    from .outcome import EXIT_CODES as EXIT_CODES, Outcome as Outcome, exit_code_for as exit_code_for
    from .spec import RunSpec as RunSpec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'slotq' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
