"""Who may wait in a pool's line: the host's `[admission]` limits
(config.py: `max_waiting` in a pool, `max_waiting_per_user` of them one
user's). On a shared pool they are the host's alone: a member's own config
may tighten them, never loosen them (config.HostConfig._agree_with_host)."""

from __future__ import annotations

import os

from ..errors import AdmissionRefused


def judge(pool: str, live: list[str], max_waiting: int | None, per_user: int | None) -> None:
    """AdmissionRefused if the host's [admission] limits leave this user no
    place in `pool`'s line, whose live tickets are at `live` (ticket.py
    reads them from the kernel, under the counter's lock, so two callers
    cannot both take the last place). Each ticket's user is its file's
    owner (fstat)."""
    if max_waiting == 0:
        raise AdmissionRefused(f"not admitted: the run would have to wait in pool {pool}, and the host lets no "
                               f"run wait (host policy [admission] max_waiting = 0)")
    per_owner: dict[int, int] = {}
    for path in live:
        try:
            owner = os.stat(path).st_uid  # the kernel's word, not the ticket's
        except OSError:
            continue
        per_owner[owner] = per_owner.get(owner, 0) + 1
    mine = per_owner.get(os.getuid(), 0)
    if per_user == 0:
        raise AdmissionRefused(f"not admitted: the run would have to wait in pool {pool}, and the host lets "
                               f"none of your runs wait (host policy [admission] max_waiting_per_user = 0)")
    if per_user is not None and mine >= per_user:
        raise AdmissionRefused(f"not admitted: you already have {mine} run(s) waiting in pool {pool} "
                               f"(host policy [admission] max_waiting_per_user = {per_user})")
    # A user's tickets past their own limit passed no admission (made by
    # hand, or by a config that left the limits out): they count against
    # that user only, never towards the line that turns the others away.
    waiting = sum(n if per_user is None else min(n, per_user) for n in per_owner.values())
    if max_waiting is not None and waiting >= max_waiting:
        raise AdmissionRefused(f"not admitted: pool {pool} already has {waiting} run(s) waiting "
                               f"(host policy [admission] max_waiting = {max_waiting})")
