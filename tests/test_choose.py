"""Choosing among several hosts: the expected-wait estimate as a pure function."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slotq.client.choose import describe_choice, expected_wait, rank_hosts


Slot = tuple[bool, float] | tuple[bool, float, float]


def snap(slots: Sequence[Slot], waiting: int = 0,
         runs: list[float] | None = None, classes: tuple[str, ...] = ("shared",)) -> dict[str, object]:
    """Slots as (held, held_s) or (held, held_s, budget)."""
    return {
        "pools": [{"pool": "shared", "classes": list(classes),
                   "slots": [{"held": s[0], "held_s": s[1], **({"budget": s[2]} if len(s) > 2 else {})}
                             for s in slots],
                   "waiting": [{"seq": i} for i in range(waiting)]}],
        "history": [{"ran_s": r} for r in (runs or [])],
    }


@pytest.mark.parametrize("slots,waiting,runs,expected", [
    ([(False, 0)], 0, [], 0),                    # free slot, nobody waiting
    ([(True, 10)], 0, [40], 30),                 # holder 10 s into a typical 40 s run
    ([(True, 10)], 2, [40], 110),                # then two full runs ahead of us
    ([(True, 50)], 0, [40], 25),                 # past typical: half as long again as it ran, never 0
    ([(True, 1.0)], 0, [0.005], 0.5),            # far past a typical run of 5 ms: not "free now"
    ([(True, 540, 600)], 0, [1800], 60),         # its budget ends it sooner than a typical run would
    ([(True, 10), (False, 0)], 1, [40], 30),     # the waiter takes the free slot
    ([(True, 0)], 0, [], 60),                    # no history: 60 s assumed
    ([(True, 5), (True, 25)], 1, [30, 30, 90], 25),
])
def test_expected_wait_table(slots: list[Slot], waiting: int, runs: list[float], expected: float) -> None:
    wait, why = expected_wait(snap(slots, waiting, runs), "shared")
    assert wait == pytest.approx(expected)
    assert f"{waiting} waiting" in why


def test_reversing_the_slot_order_gives_the_same_answer() -> None:
    slots: list[tuple[bool, float]] = [(True, 5), (False, 0), (True, 70), (True, 12)]
    a = expected_wait(snap(slots, 3, [30, 50]), "shared")
    b = expected_wait(snap(list(reversed(slots)), 3, [50, 30]), "shared")
    assert a == b


def test_a_host_without_the_class_is_never_chosen() -> None:
    assert expected_wait(snap([(False, 0)], classes=("landing",)), "shared")[0] == float("inf")


def test_rank_prefers_shorter_waits_then_less_crowd_then_given_order() -> None:
    snaps = {
        "busy": snap([(True, 1)], 0, [100]),
        "free": snap([(False, 0)]),
        "free-but-queued": snap([(False, 0), (True, 1)], 0),
        "down": None,
    }

    def fetch(h: str) -> dict[str, object]:
        s = snaps[h]
        if s is None:
            raise OSError("unreachable")
        return s

    ranked = rank_hosts(["down", "busy", "free-but-queued", "free"], "shared", fetch)
    assert [h for _, h, _ in ranked] == ["free", "free-but-queued", "busy", "down"]
    line = describe_choice(ranked)
    assert line.startswith("slotq: chose host free: expected wait 0ms") and "down: unavailable (unreachable)" in line


@pytest.mark.parametrize("odd", [
    {"pools": [{"pool": "shared", "classes": ["shared"], "slots": [{"held": False}], "waiting": 5}]},
    {"pools": [{"pool": "shared", "classes": ["shared"], "slots": [{"held": False}]}], "history": 7},
    {"pools": [{"pool": "shared", "classes": 5, "slots": [{"held": False}]}]},
])
@pytest.mark.timeout(10)
def test_a_host_whose_status_cannot_be_read_is_passed_over_not_a_traceback(odd: dict[str, object]) -> None:
    # JSON from another slotq (or something else answering as it): a field
    # of another type made the choice raise, and the run ended in a traceback.
    ranked = rank_hosts(["odd", "free"], "shared", lambda h: odd if h == "odd" else snap([(False, 0)]))
    assert ranked[0][1] == "free" and ranked[1] == (float("inf"), "odd", "host odd: unreadable status")
