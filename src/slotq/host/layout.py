"""The state dir's layout version: which files mean what there (tickets,
slots, seq, the history's files, drain.<pool>). Its owner's runs write it
in `layout` (a shared dir's is root's: `slotq host init`); a release that
changes the layout raises LAYOUT and says so in CHANGELOG.md, and a slotq
refuses a state dir of a newer layout than it knows. Releases that share a
state dir share its layout (docs/operating.md, "Upgrades")."""

from __future__ import annotations

import os

from ..errors import StateDirError

LAYOUT = 1
LAYOUT_FILE = "layout"


def layout_of(state_dir: str) -> int | None:
    """The layout its owner (root or the dir's owner) wrote; None if none
    (a state dir made before slotq 0.2.0: layout 1) or not theirs."""
    from ..statefile import StateFileError, open_state, read_limited
    from .drain import owners

    try:
        fd, _ = open_state(os.path.join(state_dir, LAYOUT_FILE), os.O_RDONLY)
    except (OSError, StateFileError):
        return None
    try:
        if os.fstat(fd).st_uid not in owners(state_dir):
            return None
        text = read_limited(fd, 16, LAYOUT_FILE).strip()
    except (OSError, StateFileError):
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() else None


def check_layout(state_dir: str) -> None:
    """Refuse a state dir of a newer layout than ours (StateDirError);
    write `layout` in one of ours that has none (a shared one's is root's:
    `slotq host init`)."""
    path = os.path.join(state_dir, LAYOUT_FILE)
    if os.path.lexists(path):
        found = layout_of(state_dir)
        if found is not None and found > LAYOUT:
            from .. import __version__

            raise StateDirError(f"state directory {state_dir} has layout {found}, newer than this slotq "
                                f"{__version__} knows ({LAYOUT}): upgrade slotq (pip install -U slotq)", state_dir)
        return
    if os.stat(state_dir).st_uid != os.getuid():
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return  # made by another of our runs just now
    try:
        os.write(fd, b"%d\n" % LAYOUT)
    finally:
        os.close(fd)
