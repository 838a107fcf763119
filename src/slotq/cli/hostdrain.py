"""`slotq host drain [POOL...] --reason TEXT` and `slotq host resume
[POOL...]`: the pool owner stops a pool starting commands, and lets it
start them again (host/drain.py says what a drain does)."""

from __future__ import annotations

import os
import sys

from slotq.cli.args import Opt, Parser
from slotq.errors import SlotqError, StateDirError

EXIT_REFUSED = 77  # EX_NOPERM: not the pool's owner

DRAIN = Parser(
    prog="slotq host drain", usage="slotq host drain [POOL...] --reason TEXT",
    description="As the pool's owner (root, or the state dir's owner): start no new command in POOL (default: "
                "every pool) until `slotq host resume`. Running commands finish under their own budgets; "
                "waiting runs keep their places and show the reason; new runs join the line. "
                "Exit codes: 0 done, 64 bad arguments, 73 the state dir cannot be used, 77 not the owner, "
                "78 bad host.toml.",
    command="positional",
    options=[Opt("--reason", metavar="TEXT", help="why, and until when: every waiting run shows it (needed)")],
)
RESUME = Parser(
    prog="slotq host resume", usage="slotq host resume [POOL...]",
    description="As the pool's owner: let a drained POOL (default: every pool) start commands again; its "
                "waiting runs take the slots in line order at once. "
                "Exit codes: 0 done, 64 bad arguments, 73 the state dir cannot be used, 77 not the owner, "
                "78 bad host.toml.",
    command="positional",
    options=[],
)


class NotOwner(SlotqError):
    exit_code = EXIT_REFUSED


def main(args: list[str], resume: bool) -> int:
    parser = RESUME if resume else DRAIN
    opts, pools = parser.parse(args)
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.host import drain

    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)
    unknown = [p for p in pools if p not in config.pools]
    if unknown:
        raise parser.error(f"unknown pool {unknown[0]!r} (this host's pools: {', '.join(config.pools)})")
    reason = "" if resume else (opts.reason or "").strip()
    if not resume and not reason:
        raise parser.error("say why with --reason TEXT (every waiting run shows it)")
    from slotq.host.hostqueue import ensure_state_dir

    ensure_state_dir(state_dir)  # (a fresh host's: its owner drains it before anyone ran)
    _check_owner(state_dir)
    from slotq.records import printable

    reason = printable(reason, drain.MAX_REASON)
    for pool in pools or list(config.pools):
        running, waiting = _counts(state_dir, pool, config.pools[pool])
        if resume:
            was = drain.remove(state_dir, pool)
            sys.stdout.write(f"resumed pool {pool}: {waiting} waiting take the slots in line order\n" if was
                             else f"pool {pool} was not drained\n")
        else:
            drain.write(state_dir, pool, reason)
            sys.stdout.write(f"drained pool {pool}: no new command starts; {running} running finish under "
                             f"their budgets, {waiting} waiting keep their places\n")
    return 0


def _check_owner(state_dir: str) -> None:
    """Only root or the state dir's owner drains (the kernel's word)."""
    from slotq.host.drain import owners
    from slotq.procinfo import user_name

    try:
        st = os.stat(state_dir)
    except OSError as e:
        raise StateDirError(f"state directory {state_dir}: {e.strerror}", state_dir) from None
    if os.geteuid() not in owners(state_dir):
        raise NotOwner(f"only root or the state directory's owner ({user_name(st.st_uid)}) may do this; "
                       f"you are {user_name(os.geteuid())}")


def _counts(state_dir: str, pool: str, slots: int) -> tuple[int, int]:
    """(slots held, runs waiting) of `pool`, as `slotq status` sees them."""
    import time

    from slotq.host.proclocks import owners
    from slotq.host.status import holders, waiting

    table, now = owners(), time.time()
    return (sum(1 for s in holders(state_dir, pool, slots, now, None, table) if s.get("held")),
            len(waiting(state_dir, pool, now, table)))
