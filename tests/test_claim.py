"""The claim window (host/claim.py), as pure logic: a fake clock, a lock
table made by hand. The real thing, as two users, is in
test_shared_trust.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slotq.host import claim
from slotq.host.claim import BUSY_WINDOW, CLAIM_WINDOW, Claims

GONE = 2 ** 22 + 12345  # a pid no process has (its CPU reads as constant)


def _key(p: Path) -> tuple[int, int]:
    st = os.stat(p)
    return st.st_dev, st.st_ino


@pytest.fixture
def line(tmp_path: Path) -> tuple[Claims, list[Path], Path]:
    """Two tickets ahead of ours, one slot."""
    tickets = [tmp_path / f"{i:016d}.t" for i in (1, 2)]
    slot = tmp_path / "shared.0"
    for p in (*tickets, slot):
        p.touch()
    return Claims([(str(p), *_key(p), os.stat(p).st_ctime_ns) for p in tickets], [str(slot)]), tickets, slot


def _table(*held: Path) -> dict[tuple[int, int], list[int]]:
    return {_key(p): [GONE] for p in held}


@pytest.mark.timeout(10)
def test_an_idle_head_leaving_the_slot_free_is_passed_over_after_the_window(line: tuple[Claims, list[Path], Path]
                                                                           ) -> None:
    claims, (first, second), _ = line
    table = _table(first, second)
    assert claims.look(100.0, table) is None  # first seen
    assert claims.look(100.0 + CLAIM_WINDOW - 0.1, table) is None
    assert claims.look(100.0 + CLAIM_WINDOW, table) == str(first)
    assert claims.passed == {str(first)}
    # The next head is judged on its own, from its own first look.
    assert claims.look(100.0 + CLAIM_WINDOW + 1, table) is None
    assert claims.look(100.0 + 2 * CLAIM_WINDOW, table) is None
    assert claims.look(100.0 + 2 * CLAIM_WINDOW + 1, table) == str(second)


@pytest.mark.timeout(10)
def test_a_busy_slot_or_a_new_head_starts_the_window_again(line: tuple[Claims, list[Path], Path]) -> None:
    claims, (first, second), slot = line
    assert claims.look(0.0, _table(first, second)) is None
    assert claims.look(4.0, _table(first, second, slot)) is None  # the slot taken: no claim owed
    assert claims.look(6.0, _table(first, second)) is None  # free again: a new window
    assert claims.look(6.0 + CLAIM_WINDOW - 0.1, _table(first, second)) is None
    assert claims.look(20.0, _table(second)) is None  # the first went: the second is a new head
    assert claims.look(20.0 + CLAIM_WINDOW, _table(second)) == str(second)
    assert claims.passed == {str(second)}


@pytest.mark.timeout(10)
def test_a_head_whose_holder_uses_cpu_gets_the_busy_window(line: tuple[Claims, list[Path], Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    claims, (first, second), _ = line
    ticks = iter(range(1000))
    monkeypatch.setattr(claim, "_cpu_ticks", lambda pids: next(ticks))  # loading: a new figure every look
    table = _table(first, second)
    t = 0.0
    while t < BUSY_WINDOW:
        assert claims.look(t, table) is None, t
        t += 1.0
    assert claims.look(BUSY_WINDOW, table) == str(first)


@pytest.mark.timeout(10)
def test_nobody_is_passed_over_without_the_kernels_word(line: tuple[Claims, list[Path], Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    claims, _, _ = line
    monkeypatch.setattr("slotq.host.proclocks.raw", lambda: None)
    for t in range(0, 100, 5):
        assert claims.look(float(t)) is None
    assert not claims.passed


@pytest.mark.timeout(10)
def test_a_users_later_runs_pass_over_at_once_what_its_runs_passed_over(line: tuple[Claims, list[Path], Path],
                                                                       tmp_path: Path) -> None:
    claims, (first, second), slot = line
    shared = tmp_path / "passed"
    ahead = [(str(p), *_key(p), os.stat(p).st_ctime_ns) for p in (first, second)]
    one = Claims(ahead, [str(slot)], str(shared))
    assert not one.passed
    table = _table(first, second)
    assert one.look(0.0, table) is None
    assert one.look(CLAIM_WINDOW, table) == str(first)
    assert Claims(ahead, [str(slot)], str(shared)).passed == {str(first)}  # a later run: at once
    # A ticket made anew under the same name and inode number is not it.
    remade = [(str(first), *_key(first), os.stat(first).st_ctime_ns + 1), ahead[1]]
    assert not Claims(remade, [str(slot)], str(shared)).passed
    # Nor is a file someone else could have written trusted.
    shared.chmod(0o666)
    assert not Claims(ahead, [str(slot)], str(shared)).passed
