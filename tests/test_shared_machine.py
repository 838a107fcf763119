"""A shared test machine is safe to share (issue 11): two ordinary users,
`slotqa` (A, the victim) and `slotqb` (B, the attacker), members of one
group (scripts/test-users makes them), share a state dir made by
`slotq host init` -- or, where an attack needs a directory B can write
names into, the old group-writable layout the README used to document.

Every attack from the issue is a test: links planted where slotq opens
files leave A's files byte-for-byte unchanged, FIFOs give an error and
never a hang, a config B wrote is ignored, the ticket order survives a
rewritten counter and a renamed ticket, whoever holds a lock by hand is
named with their user, and corrupt state is survived."""

from __future__ import annotations

import grp
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import catches, one_line, reachable, slotq_cmd, wait_for
from slotq.host.control import listening
from shared_world import FLOCK_BY_HAND, GROUP, SKIP_WHY, USERS, World, make_root, snapshot_files, \
    stop_users_processes, ticket_by_hand, world  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2 or not GROUP, reason=SKIP_WHY)


def _bare(mode: int) -> Iterator[World]:
    root = make_root()
    try:
        state = root / "state"
        state.mkdir()
        os.chown(state, 0, grp.getgrnam(GROUP).gr_gid)
        os.chmod(state, mode)
        yield World(root, state)
    finally:
        stop_users_processes(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def legacy() -> Iterator[World]:
    """The layout the README used to document: a group-owned 2775 dir, no
    sticky bit -- any member could delete another's slot file."""
    yield from _bare(0o2775)


@pytest.fixture
def bare() -> Iterator[World]:
    """A root-owned sticky 3775 dir with nothing made in advance (no
    `host init`): B can still put any name there that nobody took yet."""
    yield from _bare(0o3775)


@pytest.mark.timeout(60)
def test_run_refuses_a_shared_dir_not_made_by_host_init_and_status_warns(legacy: World) -> None:
    run = legacy.run(legacy.a, "run", "-q", "--", "touch", str(legacy.home(legacy.a) / "ran"))
    assert run.returncode == 73 and not (legacy.home(legacy.a) / "ran").exists()
    assert f"state dir {legacy.state} is shared unsafely: {legacy.state} is writable by others and is not " \
           f"sticky" in one_line(run) and f"slotq host init --shared {legacy.state} --group GROUP" in run.stderr
    status = legacy.run(legacy.b, "status")
    assert status.returncode == 0
    assert "is shared by several users but not set up for it" in status.stdout
    assert "slotq host init --shared" in status.stdout
    # Migrated in place, the same dir serves both.
    init = subprocess.run(slotq_cmd() + ["host", "init", "--shared", str(legacy.state), "--group", GROUP],
                          capture_output=True, text=True, timeout=30)
    assert init.returncode == 0, init.stderr
    assert legacy.run(legacy.a, "run", "-q", "--", "true").returncode == 0


@pytest.mark.timeout(60)
def test_a_group_writable_dir_of_ones_own_passes_until_another_user_puts_a_file_in_it(legacy: World) -> None:
    # A umask of 002 makes a private state dir group-writable: still A's alone.
    w = legacy
    os.chown(w.state, w.uid(w.a), -1)
    assert w.run(w.a, "run", "-q", "--", "true").returncode == 0
    assert (w.state / "slots").stat().st_mode & 0o020  # group-writable, made so by A's umask
    assert w.py(w.b, f"open({str(w.state / 'tickets' / 'planted')!r}, 'w').close()").returncode == 0
    run = w.run(w.a, "run", "-q", "--", "true")
    assert run.returncode == 73 and f"{w.state / 'tickets'} is writable by others and is not sticky" in run.stderr


# ---------------------------------------------------------------- planted links

# (".host-config.cache" is where slotq kept one shared cache before: the
# attack the issue reproduced through it.)
LEGACY_TARGETS = ["seq", "slots/shared.0", "history.jsonl", "host.toml", "tickets/shared", "work/{uid}",
                  ".host-config.cache.{uid}", ".host-config.cache"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("rel", LEGACY_TARGETS)
def test_a_link_planted_at_a_state_path_never_writes_through(bare: World, rel: str) -> None:
    w = bare
    victim, before = w.victim()
    target = victim / "bashrc" if rel not in ("tickets/shared", "work/{uid}") else victim
    rel = rel.format(uid=w.uid(w.a))
    for sub in ("slots", "tickets", "work"):
        if rel.startswith(sub + "/"):
            (w.state / sub).mkdir(exist_ok=True)
            os.chown(w.state / sub, 0, w.gid)
            os.chmod(w.state / sub, 0o3775)
    plant = w.py(w.b, f"import os; os.symlink({str(target)!r}, {str(w.state / rel)!r})")
    assert plant.returncode == 0, plant.stderr
    run = w.run(w.a, "run", "--", "sh", "-c", "echo ran")
    status = w.run(w.a, "status")
    hello = w.run(w.a, "host", "hello")
    assert snapshot_files(victim) == before, "A's files were changed through B's link"
    assert sorted(p.name for p in victim.iterdir()) == sorted(before)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    if rel in ("seq", "slots/shared.0", "tickets/shared"):
        # Nothing slotq can do without them: a one-line error naming the path.
        assert run.returncode == 73, run.stderr
        assert str(w.state / rel) in one_line(run) and "symbolic link" in run.stderr
    elif rel.startswith("work/"):
        assert run.returncode == 0  # a local run has no work dir; the remote host side goes beside the link:
        root = Path(json.loads(hello.stdout)["work_root"])
        assert hello.returncode == 0 and root != w.state / rel and root.name.startswith(f"{w.uid(w.a)}.")
    else:
        assert run.returncode == 0 and "ran" in run.stdout, run.stderr
        if rel == "host.toml":
            assert "ignoring host config" in run.stderr and "symbolic link" in run.stderr


@pytest.mark.timeout(60)
def test_links_at_the_names_b_can_still_create_in_an_init_dir_are_harmless(world: World) -> None:
    w = world
    victim, before = w.victim()
    uid = w.uid(w.a)
    code = f"""
import os
s = {str(w.state)!r}
os.symlink({str(victim / 'bashrc')!r}, os.path.join(s, ".host-config.cache.{uid}"))
os.symlink({str(victim)!r}, os.path.join(s, "work", "{uid}"))
for seq in range(1, 30):  # the next ticket names
    os.symlink({str(victim / 'notes.txt')!r}, os.path.join(s, "tickets", "shared", "%016d.t" % seq))
"""
    assert w.py(w.b, code).returncode == 0
    run = w.run(w.a, "run", "--json", str(w.home(w.a) / "r.json"), "--", "true")
    assert run.returncode == 0, run.stderr
    result = json.loads((w.home(w.a) / "r.json").read_text())
    assert result["ticket"] >= 30  # numbered past the planted names, never through them
    hello = w.run(w.a, "host", "hello")
    assert hello.returncode == 0 and json.loads(hello.stdout)["work_root"] != str(w.state / "work" / str(uid))
    assert snapshot_files(victim) == before


# ---------------------------------------------------------------- FIFOs and odd files

@pytest.mark.timeout(60)
@pytest.mark.parametrize("rel", ["seq", "history.jsonl", "host.toml", ".host-config.cache.{uid}", ".host-config.cache",
                                 "slots/shared.0"])
def test_a_fifo_at_a_state_path_is_an_error_not_a_hang(bare: World, rel: str) -> None:
    w = bare
    rel = rel.format(uid=w.uid(w.a))
    if rel.startswith("slots/"):
        (w.state / "slots").mkdir()
        os.chmod(w.state / "slots", 0o3777)
    assert w.py(w.b, f"import os; os.mkfifo({str(w.state / rel)!r}, 0o666)").returncode == 0
    run = w.run(w.a, "run", "--", "true", timeout=20)
    status = w.run(w.a, "status", timeout=20)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    if rel in ("seq", "slots/shared.0"):
        assert run.returncode == 73 and "is a FIFO" in one_line(run)
        assert "is a FIFO" in status.stdout or "not a regular file" in status.stdout
    else:
        assert run.returncode == 0, run.stderr
    if rel == "history.jsonl":
        assert f"state file {w.state / rel} is a FIFO" in status.stdout, status.stdout


# ---------------------------------------------------------------- trusted config

@pytest.mark.timeout(60)
def test_a_config_written_by_another_user_is_ignored_with_a_warning(bare: World) -> None:
    w = bare
    cfg = w.state / "host.toml"
    assert w.py(w.b, f"open({str(cfg)!r}, 'w').write('[pools]\\nshared = 8\\n[defaults]\\nbudget = \"1s\"\\n')"
                ).returncode == 0
    run = w.run(w.a, "run", "--", "python3", "-c",
                "import time; time.sleep(1.5)")  # sleep-ok: the command's own work, past the 1 s budget B planted
    assert run.returncode == 0, run.stderr  # the planted budget of 1s was not applied
    assert f"ignoring host config {cfg}" in run.stderr and "slotqb" in run.stderr
    status = w.run(w.a, "status", "--json")
    snap = json.loads(status.stdout)
    assert [len(p["slots"]) for p in snap["pools"] if p["pool"] == "shared"] == [1]
    assert any("ignoring host config" in x for x in snap["warnings"])


@pytest.mark.timeout(60)
def test_a_config_the_group_can_write_is_ignored_until_it_is_not(bare: World) -> None:
    # Owned by root, a trusted owner; but any member of the group could
    # rewrite it, so it is as good as written by another user.
    w = bare
    cfg = w.state / "host.toml"
    cfg.write_text("[pools]\nshared = 8\n")
    os.chown(cfg, 0, grp.getgrnam(GROUP).gr_gid)

    def shared_slots_and_warnings() -> tuple[list[int], list[str]]:
        status = w.run(w.a, "status", "--json")
        assert status.returncode == 0, status.stderr
        snap = json.loads(status.stdout)
        return [len(p["slots"]) for p in snap["pools"] if p["pool"] == "shared"], snap["warnings"]

    os.chmod(cfg, 0o664)
    slots, warnings = shared_slots_and_warnings()
    assert slots == [1] and any(f"ignoring host config {cfg}" in x and "writable by others (mode 0664)" in x
                                for x in warnings), warnings
    os.chmod(cfg, 0o644)
    slots, warnings = shared_slots_and_warnings()
    assert slots == [8] and not any("ignoring host config" in x for x in warnings), warnings


@pytest.mark.timeout(60)
def test_a_forged_config_cache_is_not_used(world: World) -> None:
    """B cannot write A's cache (per user, A's own 0600 file); a cache of
    B's own forging with matching keys is never read by A."""
    w = world
    assert w.run(w.b, "run", "-q", "--", "true").returncode == 0
    b_cache = w.state / f".host-config.cache.{w.uid(w.b)}"
    text = b_cache.read_text()
    data = json.loads(text)
    data["data"] = {"pools": {"shared": 8, "landing": 1}}
    assert w.py(w.b, f"open({str(b_cache)!r}, 'w').write({json.dumps(data)!r})").returncode == 0
    # A uses only its own cache: plant B's forged one under A's name? B cannot
    # (sticky dir, A's file) -- once A has run; before, B could create it:
    a_cache = w.state / f".host-config.cache.{w.uid(w.a)}"
    assert w.py(w.b, f"open({str(a_cache)!r}, 'w').write({json.dumps(data)!r})").returncode == 0
    snap = json.loads(w.run(w.a, "status", "--json").stdout)
    assert [len(p["slots"]) for p in snap["pools"] if p["pool"] == "shared"] == [1]


# ---------------------------------------------------------------- order and exclusivity

def _hold(w: World, user: str, gate: Path, *extra: str) -> subprocess.Popen[bytes]:
    p = w.popen(user, "run", "-q", *extra, "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    wait_for(lambda: _holder(w) is not None, what="the holder running")
    return p


def _holder(w: World) -> dict[str, object] | None:
    snap = json.loads(w.run(w.a, "status", "--json").stdout)
    for p in snap["pools"]:
        if p["pool"] == "shared":
            held = [s for s in p["slots"] if s["held"] and s.get("phase") == "running"]
            return held[0] if held else None
    return None


def _waiting(w: World) -> list[dict[str, object]]:
    snap = json.loads(w.run(w.a, "status", "--json").stdout)
    return [x for p in snap["pools"] if p["pool"] == "shared" for x in p["waiting"]]


@pytest.mark.timeout(90)
def test_a_rewritten_counter_never_lets_a_newcomer_jump_the_line(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder = _hold(w, w.a, gate)
    first = w.popen(w.a, "run", "-q", "--json", str(w.home(w.a) / "first.json"), "--", "true")
    wait_for(lambda: len(_waiting(w)) == 1, what="the first waiter in line")
    ticket = _waiting(w)[0]["seq"]
    assert w.py(w.b, f"open({str(w.state / 'seq')!r}, 'w').write('0\\n')").returncode == 0
    late = w.popen(w.b, "run", "-q", "--json", str(w.home(w.b) / "late.json"), "--", "true")
    wait_for(lambda: len(_waiting(w)) == 2, what="the newcomer in line")
    assert [x["seq"] for x in _waiting(w)][0] == ticket  # the first is still first
    gate.touch()
    assert holder.wait(timeout=30) == 0 and first.wait(timeout=30) == 0 and late.wait(timeout=30) == 0
    r1 = json.loads((w.home(w.a) / "first.json").read_text())
    r2 = json.loads((w.home(w.b) / "late.json").read_text())
    assert r2["ticket"] > r1["ticket"] == ticket
    assert r1["phases"]["started"] <= r2["phases"]["started"]


@pytest.mark.timeout(90)
def test_a_renamed_ticket_is_placed_last_and_named(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder = _hold(w, w.a, gate)
    a_wait = w.popen(w.a, "run", "-q", "--", "true")
    wait_for(lambda: len(_waiting(w)) == 1, what="A's waiter")
    b_wait = w.popen(w.b, "run", "-q", "--", "true")
    wait_for(lambda: len(_waiting(w)) == 2, what="B's waiter")
    line = _waiting(w)
    a_seq, b_seq = line[0]["seq"], line[1]["seq"]
    pdir = w.state / "tickets" / "shared"
    b_ticket = pdir / f"{b_seq:016d}.t"
    forged = pdir / f"{1:016d}.t"
    # The kernel's clock moves on; then B renames its ticket to number 1.
    start = time.monotonic()
    wait_for(lambda: time.monotonic() - start > 1.2, timeout=5, what="a second and more")
    assert w.py(w.b, f"import os; os.rename({str(b_ticket)!r}, {str(forged)!r})").returncode == 0
    line = _waiting(w)
    assert [x["seq"] for x in line] == [a_seq, 1], line  # A still first; B's forged ticket last
    assert line[1].get("forged") is True and line[1]["user"] == w.b
    text = w.run(w.a, "status").stdout
    assert "was renamed or numbered out of order" in text and w.b in text
    gate.touch()
    for p in (holder, a_wait, b_wait):
        p.wait(timeout=30)


@pytest.mark.timeout(60)
def test_runs_of_two_users_never_overlap_in_one_slot(world: World) -> None:
    w = world
    log = w.root / "log"
    log.touch()
    os.chmod(log, 0o666)
    script = f"echo start >> {log}; sleep 0.2; echo end >> {log}"
    procs = [w.popen(u, "run", "-q", "--", "sh", "-c", script) for u in (w.a, w.b, w.a, w.b)]
    assert [p.wait(timeout=40) for p in procs] == [0, 0, 0, 0]
    assert log.read_text().split() == ["start", "end"] * 4


@pytest.mark.timeout(90)
def test_users_with_a_private_umask_still_see_and_follow_each_other_in_line(world: World) -> None:
    # A careful user's umask (077) must not hide its runs from the others in
    # a shared state dir: its ticket and its holder record are made for the
    # line to read, whatever the umask (statefile.share_created).
    w = world
    gate = w.root / "gate"
    holder = w.popen(w.a, "run", "-q", "--label", "a-holds", "--", "sh", "-c",
                     f"while [ ! -e {gate} ]; do sleep 0.05; done", umask=0o077)
    wait_for(lambda: _holder(w) is not None, what="A's run holding the slot")
    result = w.home(w.b) / "b.json"
    waiter = w.popen(w.b, "run", "-q", "--label", "b-waits", "--json", str(result), "--", "true", umask=0o077)
    wait_for(lambda: len(_waiting(w)) == 1, what="B's run in line")
    seen_by_b = w.run(w.b, "status", umask=0o077).stdout
    assert "shared#0: a-holds" in seen_by_b and f"user {w.a}" in seen_by_b, seen_by_b
    seen_by_a = w.run(w.a, "status", umask=0o077).stdout
    assert "waiting 1: b-waits" in seen_by_a and f"user {w.b}" in seen_by_a, seen_by_a
    gate.touch()
    assert holder.wait(timeout=30) == 0 and waiter.wait(timeout=30) == 0
    assert json.loads(result.read_text())["outcome"] == "passed"


# ---------------------------------------------------------------- naming people

@pytest.mark.timeout(60)
def test_a_lock_held_by_hand_is_named_with_its_user(world: World) -> None:
    w = world
    with w.by_hand(w.b, FLOCK_BY_HAND, str(w.state / "slots" / "shared.0")) as blocker:
        text = w.run(w.a, "status").stdout
        assert f"shared#0: held with no slotq record by pid {blocker.pid} (user {w.b}" in text, text
        waiter = w.popen(w.a, "run", "--report-every", "0.2", "--", "true", stderr=subprocess.PIPE)
        assert waiter.stderr is not None
        line = waiter.stderr.readline().decode()
        assert f"(user {w.b}" in line and "no slotq record" in line, line
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(timeout=20) == 130


@pytest.mark.timeout(60)
def test_a_held_ticket_counter_is_named_and_neither_closes_the_pool_nor_stops_a_cancel(world: World) -> None:
    w = world
    with w.by_hand(w.b, FLOCK_BY_HAND, str(w.state / "seq")) as blocker:
        text = w.run(w.a, "status").stdout
        assert f"the ticket counter {w.state / 'seq'} is locked by pid {blocker.pid} (user {w.b}" in text, text
        # A run joins the line without the counter's lock once nobody has
        # taken a ticket for the limit (before: exit 73 for every run).
        t0 = time.monotonic()
        proc = w.run(w.a, "run", "--", "true", timeout=40)
        assert proc.returncode == 0, proc.stderr
        assert time.monotonic() - t0 >= 2.0
        # And one waiting (for the counter, then in line) can be stopped.
        with w.by_hand(w.b, FLOCK_BY_HAND, str(w.state / "slots" / "shared.0")):
            stuck = w.popen(w.a, "run", "--", "true")
            wait_for(lambda: catches(stuck.pid, signal.SIGTERM), what="the waiting run's SIGTERM handler")
            t0 = time.monotonic()
            stuck.send_signal(signal.SIGTERM)
            assert stuck.wait(timeout=10) == 130
            assert time.monotonic() - t0 < 5


@pytest.mark.timeout(60)
def test_labels_and_forged_records_cannot_hide_a_holder(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder = _hold(w, w.b, gate, "--label", "x\n\x1b[8mhidden\x1b[0m\rboo")
    text = w.run(w.a, "status").stdout
    assert "\x1b" not in text and "\r" not in text
    line = next(x for x in text.splitlines() if "shared#0" in x)
    assert f"(user {w.b}," in line and "x?" in line
    # B rewrites its holder record to claim to be A: status still says B.
    forged = json.dumps({"label": "slotqa: pytest", "pid": 1, "run_id": "abc", "phase": "running"})
    assert w.py(w.b, f"import os; fd = os.open({str(w.state / 'slots' / 'shared.0')!r}, os.O_WRONLY); "
                     f"os.ftruncate(fd, 0); os.write(fd, {forged!r}.encode())").returncode == 0
    snap = json.loads(w.run(w.a, "status", "--json").stdout)
    slot = snap["pools"][0]["slots"][0]
    assert slot["user"] == w.b and slot["lock_pids"]
    gate.touch()
    holder.wait(timeout=30)


# ---------------------------------------------------------------- corrupt state

@pytest.mark.timeout(90)
def test_corrupt_state_is_survived(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder = _hold(w, w.b, gate)
    # A deeply nested holder record, a waiting run, a poisoned history line.
    assert w.py(w.b, f"import os; fd = os.open({str(w.state / 'slots' / 'shared.0')!r}, os.O_WRONLY); "
                     "os.ftruncate(fd, 0); os.write(fd, b'[' * 5000)").returncode == 0
    with open(w.state / "history.jsonl", "a") as f:
        f.write('{"outcome": null, "waited_s": "x", "label": ["a"]}\n' + "[" * 5000 + "\n")
    waiter = w.popen(w.a, "run", "--report-every", "0.2", "--", "true", stderr=subprocess.PIPE)
    assert waiter.stderr is not None
    assert waiter.stderr.readline().startswith(b"slotq: waiting")
    status = w.run(w.a, "status")
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert w.run(w.a, "status", "--json").returncode == 0
    gate.touch()
    assert waiter.wait(timeout=30) == 0
    holder.wait(timeout=30)
    # A's own cache full of '[': ignored, never a hang or MemoryError.
    (w.state / f".host-config.cache.{w.uid(w.a)}").unlink(missing_ok=True)
    assert w.py(w.a, f"open({str(w.state / f'.host-config.cache.{w.uid(w.a)}')!r}, 'w').write('[' * 64)"
                ).returncode == 0
    assert w.run(w.a, "run", "-q", "--", "true", timeout=20).returncode == 0


ODD_RECORDS: dict[str, dict[str, object]] = {
    "pids of the wrong type": {"pid": [], "keeper": {"a": 1}, "cmd": "1", "pid_start": 1.5},
    "numbers out of range": {"since": 10**400, "budget": -1, "grace": 1e300, "keeper": -5},
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("odd", ODD_RECORDS, ids=list(ODD_RECORDS))
def test_odd_values_in_anothers_records_are_survived(world: World, odd: str) -> None:
    """Well-formed JSON with values no slotq writes -- in B's holder record
    and in a ticket B left dead ahead of A -- is shown as unknown: A's
    status works, and A's run steps past the dead ticket and passes."""
    w = world
    gate = w.root / "gate"
    holder = _hold(w, w.b, gate)
    record = json.dumps({"run_id": "abc", "label": "b's run", "pid": 1, "phase": "running", **ODD_RECORDS[odd]})
    assert w.py(w.b, f"import os; fd = os.open({str(w.state / 'slots' / 'shared.0')!r}, os.O_WRONLY); "
                     f"os.ftruncate(fd, 0); os.write(fd, {record!r}.encode())").returncode == 0
    dead = w.state / "tickets" / "shared" / f"{1:016d}.t"  # ahead of A's, and nobody's lock on it
    assert w.py(w.b, f"open({str(dead)!r}, 'w').write({record!r})").returncode == 0
    for args in (("status",), ("status", "--json")):
        status = w.run(w.a, *args)
        assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    slot = json.loads(w.run(w.a, "status", "--json").stdout)["pools"][0]["slots"][0]
    assert slot["held"] and slot["user"] == w.b
    result = w.home(w.a) / "r.json"
    waiter = w.popen(w.a, "run", "-q", "--json", str(result), "--", "true", stderr=subprocess.PIPE)
    wait_for(lambda: len(_waiting(w)) == 1, what="A's run in line")
    gate.touch()
    assert waiter.wait(timeout=30) == 0, waiter.stderr.read() if waiter.stderr else ""
    assert json.loads(result.read_text())["outcome"] == "passed"
    holder.wait(timeout=30)


# ---------------------------------------------------------------- remote work dirs

@pytest.mark.timeout(60)
def test_the_remote_work_root_is_private_to_its_user(world: World) -> None:
    w = world
    hello = w.run(w.a, "host", "hello")
    assert hello.returncode == 0, hello.stderr
    root = Path(json.loads(hello.stdout)["work_root"])
    st = root.lstat()
    assert root.parent == w.state / "work" and stat.S_ISDIR(st.st_mode)
    assert st.st_uid == w.uid(w.a) and stat.S_IMODE(st.st_mode) & 0o777 == 0o700
    # B cannot plant a work tree in it, nor a link in its place.
    res = w.py(w.b, f"import os; os.symlink('/', {str(root / 'deadbeef00')!r})")
    assert res.returncode != 0 and "Permission denied" in res.stderr
    res = w.py(w.b, f"import os; os.rename({str(root)!r}, {str(root)!r} + 'x')")
    assert res.returncode != 0


@pytest.mark.timeout(60)
def test_a_request_naming_a_work_dir_it_cannot_enter_is_unavailable_not_a_signal(world: World) -> None:
    w = world
    closed = w.root / "closed"
    closed.mkdir(mode=0o700)  # root's: A may see it exists, not enter it
    req = json.dumps({"argv": ["true"], "cwd": str(closed), "budget": 10}).encode() + b"\n"
    proc = w.run_bytes(w.a, "host", "run", "--request-stdin", input=req)
    assert proc.returncode == 0
    from slotq import protocol

    events = [p for k, p in protocol.Decoder().feed(proc.stdout) if k == protocol.EVENT]
    exited = [e for e in events if isinstance(e, dict) and e["event"] == "exited"][-1]
    assert exited["outcome"] == "unavailable", exited
    assert "cannot enter the work dir" in str(exited["message"]) and "signal" not in str(exited["message"])


@pytest.mark.timeout(60)
def test_cancel_does_not_talk_to_a_socket_squatting_a_runs_name(world: World) -> None:
    """B binds the control socket name of A's run (as if first): `slotq
    cancel` sees from the kernel that the socket is B's while the run is
    A's, sends nothing and says so -- it never reports a cancel that did not
    happen."""
    w = world
    run_id = "deadbeef0123"
    ticket = w.state / "tickets" / "shared" / f"{99:016d}.t"
    squatter = ("import socket, sys\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                f"s.bind(b'\\0slotq-run/{run_id}')\ns.listen(1)\nprint('ready', flush=True)\n"
                "c, _ = s.accept()\nc.settimeout(2)\n"
                "try:\n    got = c.recv(64)\nexcept OSError:\n    got = b''\n"
                "print('got', got, flush=True)\n"
                "try:\n    c.sendall(b'ok\\n')\nexcept OSError:\n    pass\n")
    with w.by_hand(w.a, ticket_by_hand(ticket, {"run_id": run_id, "pid": 1, "label": "a"})), \
            w.by_hand(w.b, squatter) as squat:
        proc = subprocess.run(slotq_cmd() + ["cancel", run_id], capture_output=True, text=True, timeout=20,
                              env=dict(os.environ, SLOTQ_STATE_DIR=str(w.state)))
        assert proc.returncode == 1, proc.stderr
        assert f"held by pid {squat.pid} (user {w.b})" in one_line(proc) and "nothing sent" in proc.stderr
        out, _ = squat.communicate(timeout=10)
        assert out.strip() == b"got b''"  # the squatter heard no cancel


@pytest.mark.timeout(60)
def test_a_socket_squatting_a_waiting_runs_name_first_does_not_stop_its_cancel(world: World) -> None:
    """B watches the line and binds, as soon as A's next run shows its run
    id (in its ticket, before its runner is loaded), the name a runner used
    to bind -- the run id alone -- and one of the runner's own form with a
    token of B's guessing. A's run still listens under its own name, and A
    cancels it."""
    w = world
    gate = w.root / "gate"
    holder = _hold(w, w.a, gate)
    pdir = w.state / "tickets" / "shared"
    squatter = ("import json, os, socket, sys, time\nsocks = []\n"
                f"pdir = {str(pdir)!r}\nseen = set(os.listdir(pdir))\nprint('ready', flush=True)\n"
                "while not socks:\n"
                "    for n in set(os.listdir(pdir)) - seen:\n"
                "        try:\n            run_id = json.load(open(os.path.join(pdir, n)))['run_id']\n"
                "        except (OSError, ValueError, KeyError):\n            continue\n"
                "        for name in (b'\\0slotq-run/' + run_id.encode(),\n"
                "                     b'\\0slotq-run/' + run_id.encode() + b'/0123456789abcdef'):\n"
                "            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                "            try:\n                s.bind(name); s.listen(1); socks.append(s)\n"
                "            except OSError:\n                pass\n"
                "        print(run_id, flush=True)\n"
                "    time.sleep(0.001)\n"  # sleep-ok: B's own polling pace, in its script, not a wait of the test
                "sys.stdin.read()\n")
    with w.by_hand(w.b, squatter) as squat:
        waiter = w.popen(w.a, "run", "-q", "--", "true")
        assert squat.stdout is not None
        run_id = squat.stdout.readline().decode().strip()
        wait_for(lambda: len(listening(run_id)) == 3, what="A's run listening beside B's two sockets")
        cancel = w.run(w.a, "cancel", run_id)
        assert cancel.returncode == 0, cancel.stderr  # before: "held by ... user slotqb: nothing sent"
        assert waiter.wait(timeout=30) == 130
    gate.touch()
    assert holder.wait(timeout=30) == 0


@pytest.mark.timeout(60)
def test_another_users_silent_connection_to_a_runs_control_socket_is_refused_at_once(world: World) -> None:
    """Anyone on the machine can connect to a run's abstract control
    socket. B connects to A's running run and says nothing: the runner
    refuses B from the kernel's word on who B is, without waiting for B to
    speak (a wait would stall A's runner a second per connection)."""
    w = world
    gate = w.root / "gate"
    holder = _hold(w, w.a, gate)
    held = _holder(w)
    assert held is not None
    # A run that got its slot at once listens once its command has run 0.1 s.
    wait_for(lambda: reachable(str(held["run_id"])), what="A's run to listen for cancel")
    [name] = listening(str(held["run_id"]))  # (anyone can list the sockets: /proc/net/unix)
    silent = ("import socket, time\n"
              "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
              f"s.connect({name!r})\n"
              "s.settimeout(10)\n"
              "print(s.recv(4096).decode().strip())\n")
    out = w.py(w.b, silent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"refused: run {held['run_id']} belongs to user {w.a}", out.stdout
    cancel = w.run(w.a, "cancel", str(held["run_id"]))  # A's own cancel still works
    assert cancel.returncode == 0, cancel.stderr
    assert holder.wait(timeout=30) == 130


@pytest.mark.timeout(60)
def test_a_ticket_held_by_hand_behind_a_forged_label_is_named_by_its_owner(world: World) -> None:
    w = world
    ticket = w.state / "tickets" / "shared" / f"{5:016d}.t"
    with w.by_hand(w.b, ticket_by_hand(ticket, {"label": "slotqa: pytest", "run_id": "abc", "pid": 1})):
        text = w.run(w.a, "status").stdout
        line = next(x for x in text.splitlines() if "waiting 1:" in x)
        assert "slotqa: pytest" in line and f"(user {w.b}," in line, text
