"""Where the host keeps its state, and how it is configured.

State directory: `$SLOTQ_STATE_DIR`, else `$XDG_STATE_HOME/slotq/host`, else
`~/.local/state/slotq/host`. Host config (TOML): `$SLOTQ_CONFIG`, else
`host.toml` in the state directory; absent means the defaults:

    [pools]            # pool name -> number of slots
    shared = 1
    landing = 1

    [classes]          # run class -> pool (each pool is also a class of its own name)
    merge = "landing"

    [defaults]
    budget = "60m"     # command budget when a run names none
    kill_grace = "10s" # TERM -> KILL grace when a command is stopped
    prepare_timeout = "10m"

    [admission]        # optional; no limit by default: waiting is not failing
    max_waiting = 50            # runs waiting in one pool's line
    max_waiting_per_user = 10   # of them, one user's
"""

from __future__ import annotations

import os

from .durations import parse_duration
from .errors import ConfigError

DEFAULT_POOLS = {"shared": 1, "landing": 1}
DEFAULT_BUDGET = 3600.0
DEFAULT_KILL_GRACE = 10.0
DEFAULT_PREPARE_TIMEOUT = 600.0


def state_dir_from_env(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    env = os.environ if env is None else env
    explicit = env.get("SLOTQ_STATE_DIR")
    if explicit:
        return os.path.abspath(explicit)
    xdg = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(xdg, "slotq", "host")


class HostConfig:
    """Pools, class -> pool mapping and host defaults."""

    __slots__ = ("pools", "classes", "budget", "kill_grace", "prepare_timeout", "path", "max_waiting",
                 "max_waiting_per_user")

    def __init__(
        self,
        pools: dict[str, int] | None = None,
        classes: dict[str, str] | None = None,
        budget: float = DEFAULT_BUDGET,
        kill_grace: float = DEFAULT_KILL_GRACE,
        prepare_timeout: float = DEFAULT_PREPARE_TIMEOUT,
        path: str | None = None,
        max_waiting: int | None = None,
        max_waiting_per_user: int | None = None,
    ) -> None:
        self.pools = dict(DEFAULT_POOLS if pools is None else pools)
        self.classes = {name: name for name in self.pools}
        self.classes.update(classes or {})
        self.budget = budget
        self.kill_grace = kill_grace
        self.prepare_timeout = prepare_timeout
        self.path = path
        self.max_waiting = max_waiting
        self.max_waiting_per_user = max_waiting_per_user
        for cls, pool in self.classes.items():
            if pool not in self.pools:
                raise ConfigError(f"class {cls!r} maps to unknown pool {pool!r}", path)

    def pool_for(self, cls: str) -> str:
        """The pool that serves run class `cls`; KeyError if there is none."""
        return self.classes[cls]

    @classmethod
    def load(cls, path: str | None = None, state_dir: str | None = None) -> "HostConfig":
        """Read the host config; the defaults when no file exists.

        Raises ConfigError (with `.path`) for unreadable or invalid files.
        """
        state_dir = state_dir or state_dir_from_env()
        if path is None:
            path = os.environ.get("SLOTQ_CONFIG") or os.path.join(state_dir, "host.toml")
            if not os.path.exists(path):
                return cls()
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                key = (os.path.abspath(path), st.st_ino, st.st_size, st.st_mtime_ns)
                data = _cached(state_dir, key)
                if data is None:
                    raw = f.read()
        except OSError as e:
            raise ConfigError(f"cannot read host config {path}: {e.strerror}", path) from None
        if data is None:
            # tomllib (and the `re` it imports) costs milliseconds on every
            # run; parse once, then read the parsed form back (see _cached).
            import tomllib

            try:
                data = tomllib.loads(raw.decode("utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
                raise ConfigError(f"host config {path} is not valid TOML: {e}", path) from None
            config = cls._from_dict(data, path)  # validate before caching
            _store(state_dir, key, data)
            return config
        return cls._from_dict(data, path)

    @classmethod
    def _from_dict(cls, data: dict[str, object], path: str | None) -> "HostConfig":
        unknown = set(data) - {"pools", "classes", "defaults", "admission"}
        if unknown:
            raise ConfigError(f"host config {path}: unknown section(s) {sorted(unknown)}", path)
        pools_raw = data.get("pools", DEFAULT_POOLS)
        if not isinstance(pools_raw, dict) or not pools_raw:
            raise ConfigError(f"host config {path}: [pools] must map pool names to slot counts", path)
        pools: dict[str, int] = {}
        for name, n in pools_raw.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1 or n > 1024:
                raise ConfigError(f"host config {path}: pool {name!r} needs 1..1024 slots, got {n!r}", path)
            if not _is_name(name):
                raise ConfigError(f"host config {path}: pool name {name!r} must be letters, digits, - or _", path)
            pools[name] = n
        classes_raw = data.get("classes", {})
        if not isinstance(classes_raw, dict) or not all(isinstance(v, str) for v in classes_raw.values()):
            raise ConfigError(f"host config {path}: [classes] must map class names to pool names", path)
        defaults = data.get("defaults", {})
        if not isinstance(defaults, dict):
            raise ConfigError(f"host config {path}: [defaults] must be a table", path)
        known = {"budget", "kill_grace", "prepare_timeout"}
        if set(defaults) - known:
            raise ConfigError(f"host config {path}: unknown default(s) {sorted(set(defaults) - known)}", path)
        values: dict[str, float] = {}
        for key, fallback in (
            ("budget", DEFAULT_BUDGET),
            ("kill_grace", DEFAULT_KILL_GRACE),
            ("prepare_timeout", DEFAULT_PREPARE_TIMEOUT),
        ):
            v = defaults.get(key, fallback)
            try:
                values[key] = parse_duration(str(v), what=key, allow_zero=key == "kill_grace")
            except ValueError as e:
                raise ConfigError(f"host config {path}: {e}", path) from None
        admission = data.get("admission", {})
        if not isinstance(admission, dict):
            raise ConfigError(f"host config {path}: [admission] must be a table", path)
        if set(admission) - {"max_waiting", "max_waiting_per_user"}:
            raise ConfigError(f"host config {path}: unknown admission setting(s) "
                              f"{sorted(set(admission) - {'max_waiting', 'max_waiting_per_user'})}", path)
        limits: dict[str, int] = {}
        for key, n in admission.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n > 1_000_000:
                raise ConfigError(f"host config {path}: [admission] {key} must be a whole number 0..1000000, "
                                  f"got {n!r}", path)
            limits[key] = n
        return cls(pools, dict(classes_raw), path=path, **values, **limits)  # type: ignore[arg-type]


def _is_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "-_" for c in name)


_CACHE = ".host-config.cache"


def _cached(state_dir: str, key: tuple[object, ...]) -> dict[str, object] | None:
    """The parsed config if the cache was made from this very file (path,
    inode, size, mtime); else None."""
    import marshal

    try:
        with open(os.path.join(state_dir, _CACHE), "rb") as f:
            cached_key, data = marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if tuple(cached_key) != key or not isinstance(data, dict):
        return None
    return data


def _store(state_dir: str, key: tuple[object, ...], data: dict[str, object]) -> None:
    import marshal

    target = os.path.join(state_dir, _CACHE)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(marshal.dumps((key, data)))  # type: ignore[arg-type]
        os.replace(tmp, target)  # atomic: readers see the old or the new whole
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
