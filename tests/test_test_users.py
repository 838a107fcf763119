"""The test users run slotq from a copy they can read (shared_world's
`users_code`), never from the checkout: a clone in a private directory
(under /root, or any 0700 dir) is out of their reach, and every test that
runs as one of them must still pass there (issue 50)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shared_world import GROUP, SKIP_WHY, SRC, USERS, World, users_code, world  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2 or not GROUP, reason=SKIP_WHY)


@pytest.mark.timeout(30)
def test_the_test_users_import_slotq_from_a_copy_they_can_reach_not_from_the_checkout(world: World) -> None:
    code = users_code()
    for user in (world.a, world.b):
        proc = world.py(user, "import slotq; print(slotq.__file__)")
        assert proc.returncode == 0, proc.stderr
        imported = Path(proc.stdout.strip())
        assert imported.is_relative_to(code) and not imported.is_relative_to(SRC), imported
        assert str(SRC) not in world.env(user)["PYTHONPATH"]
    # Every dir on the way is open to others, whatever the checkout's are.
    for d in [code, *code.parents]:
        assert d.stat().st_mode & stat.S_IXOTH, d
    for dirpath, _, files in os.walk(code):
        assert all(os.stat(os.path.join(dirpath, f)).st_mode & stat.S_IROTH for f in files), dirpath
