"""The bundle of a run's modules (slotq/bundle.py): what `slotq run`
imports comes from it, a changed source wins over it, and a bundle this
interpreter cannot read is not used."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from conftest import slot_held_here, wait_for

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def _launcher(tmp_path: Path) -> tuple[Path, Path]:
    """The launcher scripts/install writes, and its bundle, in tmp_path."""
    launcher, bundle = tmp_path / "slotq", tmp_path / "run.bundle"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "write_launcher.py"), str(ROOT / "bin" / "slotq"),
                    str(launcher), str(bundle)], check=True, timeout=20)
    return launcher, bundle


def _from_files(verbose: str) -> set[str]:
    """The slotq modules `python -v` says were loaded from a file (a .pyc or
    a source), not from the bundle."""
    found = re.findall(r"^# code object from '?(\S+?)'?$", verbose, re.M)
    out = set()
    for path in found:
        p = Path(path.replace("__pycache__/", "").replace(f".{sys.implementation.cache_tag}.pyc", ".py"))
        if SRC in p.parents:
            out.add(".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"))
    return out


@pytest.mark.timeout(60)
def test_a_run_imports_its_modules_from_the_bundle_waiting_or_not(state_dir: Path, tmp_path: Path) -> None:
    launcher, _ = _launcher(tmp_path)
    argv = [sys.executable, "-S", "-v", str(launcher), "run", "--", "true"]
    # Waiting, a run imports more than one that gets its slot at once (its
    # reports, the line's view, the ledger): it waits here until it has
    # made its first report.
    with slot_held_here(state_dir):
        waiting = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(waiting.stderr or ()))
        reader.start()
        wait_for(lambda: any(line.startswith("slotq: waiting") for line in list(lines)), what="its first report")
    waiting.wait(timeout=30)
    reader.join(timeout=30)
    assert waiting.returncode == 0, "".join(lines)[-2000:]
    at_once = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert at_once.returncode == 0, at_once.stderr[-2000:]
    # Only the package and the bundle's reader come before the bundle.
    assert _from_files("".join(lines)) == {"slotq", "slotq.bundle"}, "add these to bundle.RUN_MODULES"
    assert _from_files(at_once.stderr) == {"slotq", "slotq.bundle"}, "add these to bundle.RUN_MODULES"


PROBE = textwrap.dedent("""
    import sys
    sys.path[:0] = [{pkg!r}, {src!r}]
    from slotq import bundle
    used = bundle.use({path!r})
    import bq.m
    print(used, bq.m.VALUE, type(bq.m.__loader__).__name__, bq.m.__file__)
""")


def _package(tmp_path: Path, value: int) -> Path:
    pkg = tmp_path / "pkg"
    (pkg / "bq").mkdir(parents=True, exist_ok=True)
    (pkg / "bq" / "__init__.py").write_text("")
    (pkg / "bq" / "m.py").write_text(f"VALUE = {value}\n")
    return pkg


def _write(tmp_path: Path, pkg: Path) -> Path:
    path = tmp_path / "test.bundle"
    script = (f"import sys; sys.path[:0] = [{str(pkg)!r}, {str(SRC)!r}]\n"
              f"from slotq import bundle; print(bundle.write({str(path)!r}, ('bq', 'bq.m')))")
    out = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=20)
    assert out.stdout.strip() == "2", out.stderr
    return path


def _probe(tmp_path: Path, pkg: Path, path: Path) -> list[str]:
    script = PROBE.format(pkg=str(pkg), src=str(SRC), path=str(path))
    out = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.timeout(30)
def test_a_module_whose_source_changed_since_the_bundle_is_imported_from_its_source(tmp_path: Path) -> None:
    pkg = _package(tmp_path, 1)
    path = _write(tmp_path, pkg)
    assert _probe(tmp_path, pkg, path) == ["True", "1", "_Finder", str(pkg / "bq" / "m.py")]
    (pkg / "bq" / "m.py").write_text("VALUE = 2\n")
    st = os.stat(pkg / "bq" / "m.py")
    os.utime(pkg / "bq" / "m.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # the same size: by its mtime
    assert _probe(tmp_path, pkg, path)[:3] == ["True", "2", "SourceFileLoader"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "huge index", "other format"])
def test_a_bundle_this_interpreter_cannot_read_is_not_used(tmp_path: Path, damage: str) -> None:
    pkg = _package(tmp_path, 1)
    path = _write(tmp_path, pkg)
    data = path.read_bytes()
    path.write_bytes({
        "empty": b"",
        "truncated": data[:len(data) // 2],
        "garbage": os.urandom(len(data)),
        "huge index": (1 << 40).to_bytes(8, "little") + data[8:],
        "other format": data.replace(b"slotq-bundle 1", b"slotq-bundle 9"),
    }[damage])
    used, value, loader = _probe(tmp_path, pkg, path)[:3]
    assert (value, loader) == ("1", "SourceFileLoader")
    assert used == ("True" if damage == "truncated" else "False")  # a short read of a module's code: that module


@pytest.mark.timeout(30)
def test_a_copy_of_slotq_first_on_pythonpath_is_not_served_from_the_bundle(tmp_path: Path) -> None:
    # The bundle serves a module only where the usual import would look:
    # under the package it was written for.
    pkg = _package(tmp_path, 1)
    path = _write(tmp_path, pkg)
    other = _package(tmp_path / "other", 3)
    assert _probe(tmp_path, other, path)[:3] == ["True", "3", "SourceFileLoader"]
