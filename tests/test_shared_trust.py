"""Issue 44: in a pool made by `slotq host init --shared`, one member of the
group (B) cannot harm another (A) through anything B can write there.
Each test plays B's attack as the real second user against A's real runs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import wait_for
from shared_world import GROUP, SKIP_WHY, USERS, World, ticket_by_hand, world  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2 or not GROUP, reason=SKIP_WHY)


def _pool(w: World, pool: str) -> Any:
    proc = w.run(w.a, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return next(p for p in json.loads(proc.stdout)["pools"] if p["pool"] == pool)


def _slot(w: World, pool: str) -> dict[str, object]:
    return dict(_pool(w, pool)["slots"][0])


def _waited(w: World, pool: str) -> float:
    line = _pool(w, pool)["waiting"]
    return float(line[0]["waited_s"]) if line else 0.0


def _running_holder(w: World, gate: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A's long command on shared#0 (until `gate`), and its run id."""
    holder = w.popen(w.a, "run", "-q", "--json", str(w.home(w.a) / "holder.json"), "--", "sh", "-c",
                     f"while [ ! -e {gate} ]; do sleep 0.05; done")
    wait_for(lambda: _slot(w, "shared").get("phase") == "running", what="A's command running")
    return holder, str(_slot(w, "shared")["run_id"])


FORGE = ("import json, os, sys\n"
         "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
         "data = json.dumps(json.loads(sys.argv[2])).encode()\n"
         "os.pwrite(fd, data, 0); os.ftruncate(fd, len(data))\n")


def _forge(w: World, slot: Path, record: dict[str, object]) -> None:
    pw_code = FORGE.replace("sys.argv[1]", repr(str(slot))).replace("sys.argv[2]", repr(json.dumps(record)))
    proc = w.py(w.b, pw_code)
    assert proc.returncode == 0, proc.stderr


def _queued_head(w: World, pool: str, *extra: str) -> subprocess.Popen[bytes]:
    """A's run at the head of `pool`'s line, reporting (and so looking for
    orphans) every 0.1 s; returned once it has looked for 1.5 s."""
    waiter = w.popen(w.a, "run", "-q", "--class", pool, "--report-every", "0.1", *extra, "--", "true")
    wait_for(lambda: _waited(w, pool) > 1.5, timeout=20, what=f"A's run at the head of {pool} for 1.5 s")
    return waiter


@pytest.mark.timeout(90)
def test_a_forged_record_naming_as_running_run_in_another_slot_kills_nothing(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder, run_id = _running_holder(w, gate)
    landing = w.state / "slots" / "landing.0"
    record = {"run_id": run_id, "label": "forged", "pid": 1, "pid_start": 1, "keeper": 1, "keeper_start": 1,
              "cmd": 1, "cmd_start": 1, "phase": "running", "uid": w.uid(w.a), "cls": "landing"}
    # B takes the free landing slot by hand and writes a record there that
    # names A's running run as an orphan (runner and keeper "gone").
    # The record names B's own process as the runner (so that it is not
    # taken for a new holder's), with a start time that says it is gone.
    script = ("import fcntl, json, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
              "data = json.dumps(dict(json.loads(sys.argv[2]), pid=os.getpid())).encode()\n"
              "os.pwrite(fd, data, 0); os.ftruncate(fd, len(data))\nprint('ready', flush=True)\nsys.stdin.read()\n")
    with w.by_hand(w.b, script, str(landing), json.dumps(record)):
        assert _slot(w, "landing")["phase"] == "orphaned"  # what the record claims, shown as such
        waiter = _queued_head(w, "landing")
        assert holder.poll() is None, "A's running command was killed on the word of B's record"
    _ends_untouched(w, holder, waiter, gate, run_id)


@pytest.mark.timeout(90)
def test_rewritten_start_times_in_as_own_record_do_not_get_its_command_ended(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder, run_id = _running_holder(w, gate)
    slot = w.state / "slots" / "shared.0"
    record = json.loads(slot.read_text())
    record.update(pid_start=1, keeper_start=1)  # "runner and keeper gone"
    _forge(w, slot, record)
    assert _slot(w, "shared")["phase"] == "orphaned"
    waiter = _queued_head(w, "shared")
    assert holder.poll() is None, "A's running command was killed on the word of B's record"
    _ends_untouched(w, holder, waiter, gate, run_id)


def _ends_untouched(w: World, holder: subprocess.Popen[bytes], waiter: subprocess.Popen[bytes], gate: Path,
                    run_id: str) -> None:
    """A's holder, let go, passes as if nothing had happened; A's waiter
    follows it; no history line says A's run was ended as an orphan."""
    gate.touch()
    assert holder.wait(timeout=30) == 0
    assert json.loads((w.home(w.a) / "holder.json").read_text())["outcome"] == "passed"
    assert waiter.wait(timeout=30) == 0
    assert run_id not in _history_caller_gone(w)


def _history_caller_gone(w: World) -> set[str]:
    proc = w.run(w.a, "history", "--json", "--limit", "100")
    assert proc.returncode == 0, proc.stderr
    return {r["run_id"] for r in json.loads(proc.stdout) if r.get("outcome") == "caller_gone"}


# ---------------------------------------------------------------- history: bounded reads

def _timed(w: World, user: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = w.run(user, *args)
    return proc, time.monotonic() - start


@pytest.mark.timeout(90)
def test_a_history_grown_to_a_gigabyte_hangs_nobody(world: World) -> None:
    w = world
    spool = w.state / "history.jsonl"
    assert w.run(w.a, "run", "-q", "--", "true").returncode == 0  # one honest line first
    # B grows the shared spool to 1 GiB (sparse: no newline in it) and adds
    # a single JSON line of 1 MB at its end.
    assert w.py(w.b, f"import os; fd = os.open({str(spool)!r}, os.O_WRONLY); os.ftruncate(fd, 1 << 30); "
                     "os.lseek(fd, 0, 2); os.write(fd, b'{\"label\": \"' + b'x' * (1 << 20) + b'\"}\\n')"
                ).returncode == 0
    status, took = _timed(w, w.a, "status")
    assert status.returncode == 0 and took < 5, (took, status.stderr)
    assert "has grown to 1025 MiB" in status.stdout, status.stdout
    # A run in line reads the history for its ETA: it must start when its
    # slot frees, and a stop must still stop one.
    gate = w.root / "gate"
    holder, _ = _running_holder(w, gate)
    waiter = w.popen(w.a, "run", "--report-every", "0.1", "--json", str(w.home(w.a) / "w.json"), "--", "true")
    wait_for(lambda: _waited(w, "shared") > 1, timeout=20, what="A's run in line, reporting")
    stopped = w.popen(w.a, "run", "--report-every", "0.1", "--", "true")
    wait_for(lambda: len(_pool(w, "shared")["waiting"]) == 2, timeout=20, what="a second run in line")
    stopped.terminate()
    assert stopped.wait(timeout=10) == 130  # cancelled in line
    gate.touch()
    assert holder.wait(timeout=30) == 0 and waiter.wait(timeout=30) == 0
    history, took = _timed(w, w.a, "history", "--json")
    assert history.returncode == 0 and took < 10, (took, history.stderr)
    assert "only its last 8 MiB were read" in history.stderr
    assert json.loads(history.stdout), "the newest runs are still shown"


@pytest.mark.timeout(60)
def test_a_history_lock_held_by_hand_holds_up_no_run(world: World) -> None:
    w = world
    spool = w.state / "history.jsonl"
    hold = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    with w.by_hand(w.b, hold, str(spool)):
        proc, took = _timed(w, w.a, "run", "-q", "--", "true")
        assert proc.returncode == 0 and took < 10, (took, proc.stderr)
        history, took = _timed(w, w.a, "history")
        assert history.returncode == 0 and took < 10, (took, history.stderr)
        assert "locked by someone else" in history.stderr


# ---------------------------------------------------------------- planted ticket names

@pytest.mark.timeout(60)
def test_a_planted_ticket_name_neither_closes_the_pool_nor_moves_the_numbers(world: World) -> None:
    w = world
    pdir = w.state / "tickets" / "shared"
    before = w.run(w.a, "run", "--json", "-", "-q", "--", "true")
    assert before.returncode == 0, before.stderr
    first = json.loads(before.stdout)["ticket"]  # (`true` prints nothing: stdout is the record)
    assert w.py(w.b, f"open({str(pdir / '999999999999999999.t')!r}, 'w').close()").returncode == 0
    after = w.run(w.a, "run", "--json", "-", "-q", "--", "true")
    assert after.returncode == 0, after.stderr  # before: 73, "ticket numbers exhausted"
    assert first < json.loads(after.stdout)["ticket"] <= time.time_ns() // 1000  # the name moved nothing
    status = w.run(w.a, "status")
    assert status.returncode == 0
    assert f"ignored: {pdir / '999999999999999999.t'}, a ticket name of user {w.b} that nobody holds" \
        in status.stdout, status.stdout


@pytest.mark.timeout(60)
def test_a_run_of_planted_names_ahead_of_the_clock_neither_closes_the_pool_nor_slows_it(world: World) -> None:
    w = world
    pdir = w.state / "tickets" / "shared"
    plant = ("import time\nn = time.time_ns() // 1000 + 5_000_000\nfor i in range(n, n + 500):\n"
             f"    open({str(pdir)!r} + '/%016d.t' % i, 'w').close()\n")
    assert w.py(w.b, plant).returncode == 0
    started = time.monotonic()
    after = w.run(w.a, "run", "--json", "-", "-q", "--", "true")
    assert after.returncode == 0, after.stderr  # before: "every name tried was taken", exit 73
    assert time.monotonic() - started < 5
    assert json.loads(after.stdout)["ticket"] <= time.time_ns() // 1000  # not moved past B's names


@pytest.mark.timeout(60)
def test_a_ticket_held_by_hand_at_the_last_number_is_placed_last_and_spends_no_number(world: World) -> None:
    w = world
    top = w.state / "tickets" / "shared" / "999999999999999999.t"
    with w.by_hand(w.b, ticket_by_hand(top, {"label": "the last number"})):
        proc = w.run(w.a, "run", "--json", "-", "-q", "--", "true")
        assert proc.returncode == 0, proc.stderr  # before: 73, "ticket numbers ... are exhausted"
        assert json.loads(proc.stdout)["ticket"] <= time.time_ns() // 1000
        status = w.run(w.a, "status").stdout
        assert f"ticket 999999999999999999 of user {w.b} in pool shared was renamed or numbered out of order" \
            in status, status


@pytest.mark.timeout(60)
def test_a_hard_link_to_a_slot_file_is_no_waiter(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder, _ = _running_holder(w, gate)  # shared#0 locked: a link to it would look like a live ticket
    pdir = w.state / "tickets" / "shared"
    link = pdir / f"{1:016d}.t"
    assert w.py(w.b, f"import os; os.link({str(w.state / 'slots' / 'shared.0')!r}, {str(link)!r})").returncode == 0
    assert _pool(w, "shared")["waiting"] == []  # no phantom waiter "root"
    waiter = w.popen(w.a, "run", "-q", "--", "true")
    wait_for(lambda: len(_pool(w, "shared")["waiting"]) == 1, what="A's run in line")
    gate.touch()
    assert holder.wait(timeout=30) == 0 and waiter.wait(timeout=30) == 0


# ---------------------------------------------------------------- odd files of B's

@pytest.mark.timeout(60)
def test_a_ticket_past_the_size_limit_stops_neither_status_nor_cancel(world: World) -> None:
    w = world
    gate = w.root / "gate"
    holder, _ = _running_holder(w, gate)
    big = w.state / "tickets" / "shared" / f"{90:016d}.t"
    script = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, b'{\"label\": \"' + b'x' * 70000 + b'\"}')\n"
              "print('ready', flush=True)\nsys.stdin.read()\n")
    with w.by_hand(w.b, script, str(big)):
        status = w.run(w.a, "status")
        assert status.returncode == 0, status.stderr
        assert f"ticket 90 in pool shared is held by user {w.b} with no readable slotq record" in status.stdout
        assert w.run(w.a, "status", "--json").returncode == 0
        cancel = w.run(w.a, "cancel", "--mine")
        assert cancel.returncode == 0 and "cancelled" in cancel.stderr, cancel.stderr  # A's holder
    assert holder.wait(timeout=30) == 130


@pytest.mark.timeout(30)
def test_json_to_another_users_fifo_is_refused_at_once(world: World) -> None:
    w = world
    fifo = w.state / "result.json"  # a dir B may write, and A may name
    assert w.py(w.b, f"import os; os.mkfifo({str(fifo)!r}, 0o666)").returncode == 0
    proc = w.run(w.a, "run", "--json", str(fifo), "-q", "--", "true", timeout=10)
    assert proc.returncode == 64 and "it is a FIFO of another user's" in proc.stderr, proc.stderr


@pytest.mark.timeout(60)
def test_a_work_dir_name_taken_first_by_another_user_does_not_stop_remote_runs(world: World) -> None:
    w = world
    squatted = w.state / "work" / str(w.uid(w.a))
    assert w.py(w.b, f"import os; os.makedirs({str(squatted)!r}, 0o777)").returncode == 0
    first = w.run(w.a, "host", "hello")
    assert first.returncode == 0, first.stderr  # today: 73 for ever
    root = Path(json.loads(first.stdout)["work_root"])
    st = root.stat()
    assert root != squatted and root.parent == squatted.parent and st.st_uid == w.uid(w.a)
    assert st.st_mode & 0o777 == 0o700
    again = w.run(w.a, "host", "hello")
    assert json.loads(again.stdout)["work_root"] == str(root)  # found again, not one more


# ---------------------------------------------------------------- admission: the host's policy only

@pytest.mark.timeout(90)
def test_admission_is_the_hosts_policy_and_hand_made_tickets_count_against_their_maker(world: World) -> None:
    w = world
    (w.state / "host.toml").write_text("[admission]\nmax_waiting = 2\nmax_waiting_per_user = 1\n")
    # B's own config: the host's pool sizes, and no [admission] at all.
    own = w.home(w.b) / "mine.toml"
    assert w.py(w.b, f"import os; fd = os.open({str(own)!r}, os.O_WRONLY | os.O_CREAT, 0o644); os.fchmod(fd, 0o644); "
                     "os.write(fd, b'[pools]\\nshared = 1\\nlanding = 1\\n')").returncode == 0
    gate = w.root / "gate"
    holder, _ = _running_holder(w, gate)
    b_env = {"SLOTQ_CONFIG": str(own)}
    first = w.popen(w.b, "run", "-q", "--", "true", env=b_env)
    wait_for(lambda: len(_pool(w, "shared")["waiting"]) == 1, what="B's first run in line")
    second = w.popen(w.b, "run", "-q", "--", "true", env=b_env, stderr=subprocess.PIPE)
    assert second.wait(timeout=20) == 117  # the host's max_waiting_per_user = 1, though B's config has none
    assert second.stderr is not None and b"max_waiting_per_user = 1" in second.stderr.read()
    # Two more tickets of B's, made by hand: no admission passed them.
    pdir = w.state / "tickets" / "shared"
    with w.by_hand(w.b, ticket_by_hand(pdir / f"{50:016d}.t", {"label": "raw"}, pdir / f"{51:016d}.t")):
        assert len(_pool(w, "shared")["waiting"]) == 3  # B's three tickets, all live
        mine = w.popen(w.a, "run", "-q", "--", "true")
        wait_for(lambda: len(_pool(w, "shared")["waiting"]) == 4, what="A admitted, in line")
        assert mine.poll() is None  # today: not_admitted (117), B's tickets filled the line
    gate.touch()
    assert holder.wait(timeout=30) == 0 and first.wait(timeout=30) == 0 and mine.wait(timeout=30) == 0


# ---------------------------------------------------------------- history: each user's own

def _history(w: World) -> list[dict[str, Any]]:
    proc = w.run(w.a, "history", "--json")
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


@pytest.mark.timeout(60)
def test_no_member_can_erase_or_falsify_anothers_history(world: World) -> None:
    w = world
    mine = w.run(w.a, "run", "--json", "-", "-q", "--", "true")
    assert mine.returncode == 0, mine.stderr
    run_id = json.loads(mine.stdout)["run_id"]
    spool = w.state / "history" / f"u{w.uid(w.a)}.jsonl"
    attack = (f"import json, os\np = {str(spool)!r}\nfor how in (lambda: os.truncate(p, 0), lambda: os.unlink(p),\n"
              f"            lambda: os.rename(p, p + '.x'), lambda: open(p, 'a')):\n"
              "    try:\n        how()\n    except PermissionError:\n        print('refused')\n"
              # B's own file, with a line that claims to be A's run, failed.
              f"line = dict(json.loads(open(p).readline()), outcome='failed', exit_code=1, label='forged')\n"
              f"with open({str(w.state / 'history' / f'u{w.uid(w.b)}.jsonl')!r}, 'a') as f:\n"
              "    f.write(json.dumps(line) + '\\n')\n")
    proc = w.py(w.b, attack)
    assert proc.returncode == 0 and proc.stdout.split() == ["refused"] * 4, (proc.stdout, proc.stderr)
    runs = [r for r in _history(w) if r["run_id"] == run_id]
    # A's own line stands; B's says it is B's word.
    assert sorted((r["outcome"], r["user"], r.get("recorded_by") or "") for r in runs) == \
        [("failed", w.a, w.b), ("passed", w.a, "")], runs
    status = w.run(w.a, "status").stdout
    assert f"forged (recorded by {w.b})" in status, status


@pytest.mark.timeout(60)
def test_a_shared_history_file_planted_by_a_member_is_not_read(world: World) -> None:
    w = world
    assert w.run(w.a, "run", "-q", "--", "true").returncode == 0
    month = w.state / "history" / time.strftime("%Y-%m.jsonl", time.gmtime())  # an older version's name
    line = json.dumps({"run_id": "forged", "uid": w.uid(w.a), "outcome": "failed", "label": "forged",
                       "phases": {"ended": time.time()}})
    assert w.py(w.b, f"open({str(month)!r}, 'w').write({line!r} + '\\n')").returncode == 0
    assert "forged" not in {r["run_id"] for r in _history(w)}
    assert "forged" not in w.run(w.a, "status").stdout


@pytest.mark.timeout(60)
def test_a_history_file_name_taken_first_loses_no_line(world: World) -> None:
    w = world
    taken = w.state / "history" / f"u{w.uid(w.a)}.jsonl"
    assert w.py(w.b, f"open({str(taken)!r}, 'w').close()").returncode == 0
    for _ in range(2):
        assert w.run(w.a, "run", "-q", "--", "true").returncode == 0
    assert [(r["user"], r.get("recorded_by")) for r in _history(w)] == [(w.a, None)] * 2
    [own] = [p for p in (w.state / "history").iterdir() if p.stat().st_uid == w.uid(w.a)]
    assert own.name.startswith(f"u{w.uid(w.a)}.") and own != taken and own.stat().st_mode & 0o777 == 0o644


# ---------------------------------------------------------------- a head that never claims

@pytest.mark.timeout(90)
@pytest.mark.parametrize("slots", [1, 2])  # a keeper waits (one slot); the runner itself waits (two)
def test_a_ticket_held_by_hand_at_the_head_is_passed_over_and_keeps_its_place(world: World, slots: int) -> None:
    w = world
    if slots != 1:
        (w.state / "host.toml").write_text(f"[pools]\nshared = {slots}\nlanding = 1\n")
    ticket = w.state / "tickets" / "shared" / f"{1:016d}.t"
    with w.by_hand(w.b, ticket_by_hand(ticket, {"run_id": "b0", "label": "never claims"})):
        started = time.monotonic()
        mine = w.popen(w.a, "run", "-q", "--json", str(w.home(w.a) / "r.json"), "--", "true")
        wait_for(lambda: len(_pool(w, "shared")["waiting"]) == 2, what="A's run in line behind B's ticket")
        status = w.run(w.a, "status").stdout
        wait_for(lambda: "leaves a free slot untaken" in w.run(w.a, "status").stdout, timeout=20,
                 what="status naming the head that does not claim")
        status = w.run(w.a, "status").stdout
        assert f"ticket 1 of user {w.b} is at the head of pool shared's line" in status, status
        assert mine.wait(timeout=40) == 0  # today: it waits for ever, the slot free
        took = time.monotonic() - started
        assert took < 20, took  # the claim window (5 s) and a look or two, not B's whim
        assert json.loads((w.home(w.a) / "r.json").read_text())["outcome"] == "passed"
        assert ticket.exists() and len(_pool(w, "shared")["waiting"]) == 1  # B's place is kept


# ---------------------------------------------------------------- chaos: B hostile for 30 s

HOSTILE = Path(__file__).resolve().parent / "hostile.py"


def _in_line_or_done(w: World, proc: subprocess.Popen[bytes], needle: str) -> bool:
    if proc.poll() is not None:
        return True
    pdir = w.state / "tickets" / "shared"
    for t in pdir.glob("*.t"):
        try:
            if needle in json.loads(t.read_bytes()[:65536]).get("label", ""):
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


@pytest.mark.timeout(300)
def test_a_hostile_member_for_30_s_harms_none_of_100_runs_and_status_keeps_answering(world: World) -> None:
    import shutil
    import threading

    w = world
    script = w.root / "hostile.py"
    shutil.copy(HOSTILE, script)
    script.chmod(0o644)
    order = w.home(w.a) / "order"
    statuses: list[tuple[float, int]] = []
    stop = threading.Event()

    def ask_status() -> None:
        while not stop.is_set():
            proc, took = _timed(w, w.a, "status", "--json")
            statuses.append((took, proc.returncode))

    with w.by_hand(w.b, script.read_text(), str(w.state), "30", "44") as hostile:
        asker = threading.Thread(target=ask_status)
        asker.start()
        try:
            runs = []
            for i in range(100):
                cmd = f"echo {i} >> {order}; sleep 0.1"  # sleep-ok: the command's own work (forged at)
                p = w.popen(w.a, "run", "-q", "--json", str(w.home(w.a) / f"r{i}.json"), "--", "sh", "-c", cmd)
                runs.append(p)
                wait_for(lambda: _in_line_or_done(w, p, cmd), timeout=30, what=f"A's run {i} in line")
            codes = [p.wait(timeout=120) for p in runs]
            assert hostile.stdout is not None
            assert hostile.wait(timeout=120) == 0
            acts = dict(line.split(" ", 1) for line in hostile.stdout.read().decode().splitlines())
        finally:
            stop.set()
            asker.join()
    assert codes == [0] * 100
    results = [json.loads((w.home(w.a) / f"r{i}.json").read_text()) for i in range(100)]
    assert [r["outcome"] for r in results] == ["passed"] * 100
    b_end, for_good_at = float(acts.pop("end")), float(acts.pop("for_good_at"))
    done_in_chaos = sum(r["phases"]["ended"] < b_end for r in results)
    # Runs that joined the line behind the ticket B held from its third
    # second to its end, and were done before that end: none before.
    passed_it = sum(for_good_at < r["phases"]["submitted"] and r["phases"]["ended"] < b_end for r in results)
    assert order.read_text().split() == [str(i) for i in range(100)]  # every command, once, in order
    for kind in ("forge_slot", "raw_ticket", "raw_lock", "plant_name", "counter", "silent_connect"):
        assert int(acts.get(kind, 0)) > 0, acts  # the chaos happened
    times = sorted(t for t, _ in statuses)
    print(f"chaos: {len(times)} status calls, median {times[len(times) // 2]:.3f} s, max {times[-1]:.3f} s; "
          f"{done_in_chaos} of A's runs done while B was at it ({passed_it} behind its ticket held for good); "
          f"B's acts: {acts}")
    assert passed_it >= 5, passed_it  # A's line went on past it (before: 0, all waited for B's end)
    slow = [t for t, _ in statuses if t >= 1.0]
    assert all(rc == 0 for _, rc in statuses) and not slow, (len(statuses), slow)
    assert not _history_caller_gone(w) & {r["run_id"] for r in results}
