"""`slotq host init` (issue 11) makes a shared state dir safe to share, as
root and for a known group only: nobody can remove or replace another
user's files there; its --config is checked before anything is made or
replaced; a directory of other files is never taken."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import one_line, slotq_cmd
from shared_world import GROUP, SKIP_WHY, USERS, World, make_root, world  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2 or not GROUP, reason=SKIP_WHY)


@pytest.mark.timeout(60)
def test_host_init_makes_a_dir_where_nobody_can_remove_or_replace_anothers_files(world: World) -> None:
    st = world.state.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, world.gid, 0o3775)
    for rel in ("slots", "tickets", "tickets/shared", "tickets/landing", "work"):
        s = (world.state / rel).stat()
        assert s.st_uid == 0 and s.st_mode & stat.S_ISVTX, rel
    for rel in ("seq", "slots/shared.0", "slots/landing.0", "history.jsonl"):
        s = (world.state / rel).lstat()
        assert stat.S_ISREG(s.st_mode) and s.st_uid == 0 and stat.S_IMODE(s.st_mode) == 0o660, rel
    cfg = (world.state / "host.toml").stat()
    assert cfg.st_uid == 0 and stat.S_IMODE(cfg.st_mode) == 0o644
    # B tries to delete, replace or rename each: refused by the kernel.
    code = f"""
import os, errno
out = []
for rel in ("seq", "slots/shared.0", "history.jsonl", "host.toml"):
    p = os.path.join({str(world.state)!r}, rel)
    for what, fn in (("unlink", lambda: os.unlink(p)), ("rename", lambda: os.rename(p, p + ".x"))):
        try:
            fn()
            out.append(what + " " + rel + " WORKED")
        except OSError as e:
            out.append(what + " " + rel + " " + errno.errorcode[e.errno])
    open(p + ".planted", "w").close()
    try:
        os.rename(p + ".planted", p)
        out.append("replace " + rel + " WORKED")
    except OSError as e:
        out.append("replace " + rel + " " + errno.errorcode[e.errno])
        os.unlink(p + ".planted")
print("\\n".join(out))
"""
    res = world.py(world.b, code)
    assert res.returncode == 0, res.stderr
    assert "WORKED" not in res.stdout, res.stdout
    # Both users can run, one after the other, and status is clean.
    assert world.run(world.a, "run", "-q", "--", "true").returncode == 0
    assert world.run(world.b, "run", "-q", "--", "true").returncode == 0
    status = world.run(world.a, "status")
    assert status.returncode == 0 and "warning" not in status.stdout, status.stdout


@pytest.mark.timeout(30)
def test_host_init_needs_root_and_a_known_group(tmp_path: Path) -> None:
    w = World(make_root(), tmp_path)
    try:
        proc = w.run(w.a, "host", "init", "--shared", str(w.root / "x"), "--group", GROUP)
        assert proc.returncode == 77 and "must run as root" in one_line(proc)
    finally:
        shutil.rmtree(w.root, ignore_errors=True)
    for group in ("no-such-grp", "4294967296", "999999"):  # a gid too: past the range, and one nobody has
        proc = subprocess.run(slotq_cmd() + ["host", "init", "--shared", str(tmp_path / "s"), "--group", group],
                              capture_output=True, text=True, timeout=20)
        assert proc.returncode == 64 and f"no group named {group!r}" in one_line(proc)
    assert not (tmp_path / "s").exists()


@pytest.mark.timeout(30)
def test_host_init_takes_a_group_by_its_gid_as_chgrp_does(tmp_path: Path) -> None:
    # "no group named '1002'": a gid, as admins' scripts and chgrp(1) give one.
    gid = grp.getgrnam(GROUP).gr_gid
    proc = subprocess.run(slotq_cmd() + ["host", "init", "--shared", str(tmp_path / "s"), "--group", str(gid)],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert f"tell the members of group {GROUP} to use it" in proc.stdout
    assert (tmp_path / "s").stat().st_gid == gid


@pytest.mark.timeout(60)
def test_host_init_checks_its_config_before_it_makes_or_replaces_anything(world: World, tmp_path: Path) -> None:
    """A bad --config replaced the shared dir's good host.toml and then said
    it was not valid: every member's run failed (exit 78) from then on."""
    bad, broken = tmp_path / "bad.toml", tmp_path / "broken.toml"
    bad.write_text('[pools]\nshared = "x"\n')
    broken.write_text("pools = [\n")
    good = (world.state / "host.toml").read_bytes()
    fresh = world.root / "fresh"
    for src, says in ((bad, "pool 'shared' needs 1..1024 slots"), (broken, "is not valid TOML"),
                      (tmp_path / "missing.toml", "cannot read it")):
        for top in (world.state, fresh):
            proc = subprocess.run(slotq_cmd() + ["host", "init", "--shared", str(top), "--group", GROUP,
                                                 "--config", str(src)], capture_output=True, text=True, timeout=30)
            line = one_line(proc)
            assert proc.returncode == 64 and "--config" in line and str(src) in line and says in line, line
    assert (world.state / "host.toml").read_bytes() == good
    assert not fresh.exists()
    assert world.run(world.a, "run", "-q", "--", "true").returncode == 0


@pytest.mark.timeout(30)
def test_host_init_leaves_a_directory_of_other_files_alone(tmp_path: Path) -> None:
    """`--shared /tmp` or `--shared /var/lib` (a typo) made that directory
    root's, mode 3775: no longer writable by the users outside the group."""
    other = tmp_path / "other"
    other.mkdir(mode=0o1777)
    os.chmod(other, 0o1777)
    (other / "someones-file").write_text("x")
    before = os.stat(other)
    proc = subprocess.run(slotq_cmd() + ["host", "init", "--shared", str(other), "--group", GROUP],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 64 and "is not a slotq state dir" in one_line(proc), proc.stderr
    after = os.stat(other)
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    assert sorted(os.listdir(other)) == ["someones-file"]
    empty = tmp_path / "empty"
    empty.mkdir()
    for _ in range(2):  # an empty dir is made a state dir, and that one repaired again
        proc = subprocess.run(slotq_cmd() + ["host", "init", "--shared", str(empty), "--group", GROUP],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(empty).st_mode) == 0o3775
