"""The one thing the client knows about a host: how to reach its runner.

A backend is a subclass of `Transport`, one module per way to reach a host:

    transports/local.py   this machine (the runner in a thread of the caller;
                          away.py: the caller waiting away as a shell)
    transports/ssh.py     a remote host through OpenSSH
    transports/slurm/     a Slurm cluster (srun; Slurm is the queue;
                          ctl.py asks Slurm's tools)

The client (client.py) imports only this module; the CLI picks the backend.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..client.ledger import WaitRecorder
    from ..spec import RunSpec


class Transport:
    """How a client reaches a host runner. `prepare` gets the host ready
    (connection, handshake, work tree); `start` returns (to_runner,
    from_runner) descriptors; closing to_runner tells the runner the caller
    is gone; `kill` ends the connection for good."""

    host = "localhost"
    remote = False
    # When the run joined the host's line, if the transport did that before
    # `start` (LocalTransport.reserve): the client's wait counts from then.
    queued_since: float | None = None
    # The run waited away and came back (local only: host/away.py): its
    # queue wait is open in the ledger already, since `queued_since`.
    came_back = False
    # A kept run's wait is recorded by its attacher on this machine, not by
    # the run's process on the host (a remote host's ledger is not ours).
    waits_by_caller = False
    # The run is a kept run (transports/kept.py): its caller is an attacher.
    kept = False
    # ... that comes back to it (`slotq attach`), not the caller that
    # submitted it: it sends no work tree, and says no transfer.
    attaching = False
    # When this machine knew the run had its slot, if before the host's
    # `slot` event came (late binding, transports/bound.py: the winner's
    # offer; its work tree is sent after it): the wait ends there.
    slot_seen: float | None = None
    # ... and when its work tree reached that host, and how long sending it
    # took: the record's `transferred` comes after its `slot` then.
    tree_sent: tuple[float, float] | None = None

    def prepare(self, spec: RunSpec) -> None:
        """Connect, check the host's slotq, transfer the work tree. Raises
        HostUnavailable. A local host needs none of it."""

    def notes(self) -> list[str]:
        """Warnings from `prepare` that did not stop the run, one line each
        (shown as `slotq: warning: ...`)."""
        return []

    def reserve(self, spec: RunSpec) -> None:
        """Join the host's line now, before the client is loaded, if this
        transport can (local: LocalTransport.reserve); its runner adopts
        the place. Never raises: whatever is wrong, `start` reports."""

    def start_early(self, spec: RunSpec) -> None:
        """Once the client is loaded, before the runner: start the command
        now if the place `reserve` took is the head of its line and a slot
        is free (local: LocalTransport.start_early); the runner, loaded
        meanwhile, carries the run on. Never raises: otherwise the runner
        goes its usual way."""

    def keep_wait_end(self, make_closer: Callable[[], Callable[[float], None]]) -> None:
        """Offer the host side a way to close the run's queue wait in the
        caller's wait ledger (`make_closer()` gives it: call it with the
        time the wait ended). A transport whose host-side process can
        outlive the caller on the caller's machine (local: the standby
        keeper) keeps it, so a caller killed in line still gets its wait's
        true end without waking to refresh the record; the others ignore it."""

    def go_away(self, ev: dict[str, object], *, recorder: WaitRecorder, stops: list[int]) -> str:
        """The host offers to let the caller wait away (an `away` event:
        host/away.py). Only `slotq run` on this machine can (its process is
        replaced by a shell until shortly before its turn, then started
        again from its own command line): this returns only if the caller
        stays, saying why."""
        return "not a local run of `slotq run`"

    def attach_options(self) -> list[str]:
        """What `slotq attach RUN_ID` needs besides the run id to come back
        to a kept run of this transport's (ssh: the host, and how it is
        reached); [] for this machine."""
        return []

    def describe(self) -> dict[str, object]:
        """Facts about the connection for the result (e.g. master reuse)."""
        return {"kind": "local"}

    def details(self) -> dict[str, object]:
        """Extra fields for the result JSON, asked for only when it is
        written (Slurm: the job and its final state)."""
        return {}

    def start(self, spec: RunSpec) -> tuple[int, int]:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def wait(self) -> str:
        """Reap the transport; returns diagnostics (e.g. ssh's stderr)."""
        raise NotImplementedError

    def after_loss(self, run_id: str) -> str:
        """The runner's stream ended without a result: what became of the
        run's command on the host (its keeper ended it; or both were gone
        and the orphan was ended now). "" when there is nothing to ask."""
        return ""
