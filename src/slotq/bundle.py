"""The modules a `slotq run` imports, compiled into one file that the
launcher (bin/slotq) reads at start-up.

Imported the usual way, each module costs its finder's stats, an open, a
read and a check of its .pyc; read from the bundle, a stat, a pread and
an unmarshal. For the 40-50 modules of a run that is 1.6-1.8 ms of the
22-24 ms of CPU a whole local `slotq run -q -- true` costs, and 12-14 %
more runs a second in a burst (docs/performance.md, "Per call").

`write` (scripts/write_launcher.py, at install) compiles RUN_MODULES from
their sources; `use` (the launcher) puts a finder for them first in
`sys.meta_path`. Like a .pyc, an entry holds its source's size and mtime:
a module whose source changed since is imported the usual way, so the
bundle never runs code its source no longer says. A bundle this
interpreter cannot read (another Python, a damaged file) is not used at
all. It lives beside the package's .pyc files and is trusted as they are:
whoever can write it can write slotq's code.

Only what `slotq run` imports is in it: the other commands import the
usual way, and so does a module missing from RUN_MODULES
(tests/test_bundle.py fails then, naming it).
"""

from __future__ import annotations

import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

FORMAT = "slotq-bundle 1"
MAX_INDEX = 1 << 20  # far above what the index of RUN_MODULES takes (about 4 kB)
MAX_BYTES = 4 << 20  # ... and one module's code (at most about 40 kB)

# What a local `slotq run` imports, waiting in line or not (`slotq` and
# this module are imported before the bundle is read).
RUN_MODULES = (
    "slotq.cli", "slotq.cli.args", "slotq.cli.run",
    "slotq.client", "slotq.client.caller", "slotq.client.events", "slotq.client.ledger", "slotq.client.result",
    "slotq.client.waitlines", "slotq.client.watchdogs",
    "slotq.transports", "slotq.transports.base", "slotq.transports.local",
    "slotq.host", "slotq.host.callerlink", "slotq.host.child", "slotq.host.claim", "slotq.host.control", "slotq.host.drain",
    "slotq.host.holding", "slotq.host.hostqueue", "slotq.host.hostrun", "slotq.host.inline", "slotq.host.keeper",
    "slotq.host.layout",
    "slotq.host.launch", "slotq.host.libc", "slotq.host.line", "slotq.host.lineview", "slotq.host.orphans",
    "slotq.host.process", "slotq.host.proclocks", "slotq.host.runner", "slotq.host.slot", "slotq.host.status",
    "slotq.host.terminate", "slotq.host.ticket", "slotq.host.verdict",
    "slotq.history", "slotq.history.eta",
    "slotq.clock", "slotq.config", "slotq.durations", "slotq.errors", "slotq.outcome", "slotq.procinfo",
    "slotq.protocol", "slotq.record", "slotq.records", "slotq.signals", "slotq.spec", "slotq.statefile",
)


def _header() -> tuple[str, bytes, str | None]:
    """What a bundle must have been written by: this format, this
    interpreter's bytecode (its .pyc magic number, its cache tag)."""
    magic: bytes = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
    return FORMAT, magic, sys.implementation.cache_tag


def write(path: str, names: tuple[str, ...] = RUN_MODULES) -> int:
    """Compile `names` from their sources into a bundle at `path`
    (atomically: a launcher starting meanwhile reads the old one or the
    new one). How many modules it holds.

    The file: the index's length (8 bytes), the index (marshal: the header
    and, for each module, its source's path, size and mtime, and where its
    code is, counted from the index's end), then each module's code
    (marshal)."""
    import importlib.util

    index: dict[str, tuple[str, bool, int, int, int, int]] = {}
    codes = []
    offset = 0
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise LookupError(f"{name}: no source to bundle")
        with open(spec.origin, "rb") as f:
            source = f.read()
            st = os.fstat(f.fileno())
        code = marshal.dumps(compile(source, spec.origin, "exec", dont_inherit=True))
        index[name] = (spec.origin, spec.submodule_search_locations is not None, st.st_mtime_ns, st.st_size,
                       offset, len(code))
        codes.append(code)
        offset += len(code)
    head = marshal.dumps((_header(), index))
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(len(head).to_bytes(8, "little") + head + b"".join(codes))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(index)


def use(path: str) -> bool:
    """Import the bundle's modules from `path` from now on. False, and
    nothing changed, when there is no bundle there this interpreter can
    use."""
    if sys.flags.optimize:
        return False  # compiled for -O0; `python -O` means other code
    try:
        fd = _open_above_streams(path)
    except OSError:
        return False
    try:
        length = int.from_bytes(os.pread(fd, 8, 0), "little")
        header, index = marshal.loads(os.pread(fd, length, 8)) if 0 < length <= MAX_INDEX else (None, None)
    except (OSError, EOFError, ValueError, TypeError):
        header = None
    if header != _header() or not isinstance(index, dict):
        os.close(fd)
        return False
    sys.meta_path.insert(0, _Finder(fd, 8 + length, index))
    return True


def _open_above_streams(path: str) -> int:
    """`path`, opened to read, on a descriptor above 2: a process started
    with a standard stream closed keeps that number free (slotq fills it
    with /dev/null)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if fd > 2:
        return fd
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


class _Finder:
    """A meta path finder and loader for the bundle's modules. It reads a
    module's code only when it is imported (a run imports 40 of the
    bundle's modules, a waiting one 50), and keeps the bundle open for
    that (close-on-exec: no command inherits it)."""

    def __init__(self, fd: int, codes_at: int, index: dict[str, tuple[str, bool, int, int, int, int]]) -> None:
        self._fd = fd
        self._codes_at = codes_at  # where the modules' code begins in the file
        self._index = index
        self._code: dict[str, bytes] = {}

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        entry = self._index.pop(name, None)  # a module is imported once
        if entry is None:
            return None
        try:
            origin, package, mtime_ns, size, offset, length = entry
            folder = os.path.dirname(origin)
            if (os.path.dirname(folder) if package else folder) not in (path or ()):
                return None  # its parent package is another copy of slotq (PYTHONPATH): not ours to serve
            st = os.stat(origin)
            if (st.st_mtime_ns, st.st_size) != (mtime_ns, size) or not 0 < length <= MAX_BYTES:
                return None  # its source changed: the usual import compiles it
            code = os.pread(self._fd, length, self._codes_at + offset)
        except (OSError, TypeError, ValueError):
            return None
        if len(code) != length:
            return None
        self._code[name] = code
        spec: ModuleSpec = sys.modules["_frozen_importlib"].ModuleSpec(name, self, origin=origin, is_package=package)
        spec.has_location = True  # __file__ is the source: tracebacks show its lines
        if package:
            spec.submodule_search_locations = [folder]
        return spec

    def create_module(self, spec: object) -> None:
        return None  # the usual module object

    def exec_module(self, module: ModuleType) -> None:
        exec(marshal.loads(self._code.pop(module.__name__)), module.__dict__)
