"""Where the host keeps its state, and how it is configured.

State directory: `$SLOTQ_STATE_DIR`, else `$XDG_STATE_HOME/slotq/host`, else
`~/.local/state/slotq/host`. Host config (TOML): `$SLOTQ_CONFIG`, else
yours (`$XDG_CONFIG_HOME/slotq/config.toml`: `user_config`), else
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
    attach_for = "100s"  # optional, best in your own config: every `slotq run` is a
                       # kept run, attached at most this long (as SLOTQ_ATTACH_FOR)

    [admission]        # optional; no limit by default: waiting is not failing
    max_waiting = 50            # runs waiting in one pool's line
    max_waiting_per_user = 10   # of them, one user's

    [waiting]          # optional
    away = true        # quiet local runs far back in a slow one-slot line wait
                       # as a shell (about 0.35 MB instead of 6): host/away.py
    away_look = "5m"   # ... and look again this often (1s-1d); still far back,
                       # they go away again

    [groups]           # optional: hosts to wait on as one line, `--host @ci`
    ci = ["ci1", "ci2", "ci3"]

    [slurm]            # optional: `slotq run --slurm` (transports/slurm/)
    slotq = "/opt/slotq/bin/slotq"   # slotq on the nodes (default: this one, by path)
    options = ["--account=ci"]       # given to Slurm (srun) for every run

    [slurm.classes]    # run class -> partition (and QoS); unnamed classes are refused,
    shared = { partition = "test" }  # except `shared`: Slurm's default partition
    landing = { partition = "test", qos = "landing" }
"""

from __future__ import annotations

import errno
import os

from .durations import parse_duration
from .errors import ConfigError, StateDirError

DEFAULT_POOLS = {"shared": 1, "landing": 1}
DEFAULT_BUDGET = 3600.0
DEFAULT_KILL_GRACE = 10.0
DEFAULT_PREPARE_TIMEOUT = 600.0
DEFAULT_RETENTION = 180 * 86400.0  # the run history: about six months
# A run waiting away (host/away.py) looks again at least this often: the
# ticket it waits for may be one that never goes (held by hand, passed
# over: host/claim.py). Still far back, it goes away again.
DEFAULT_AWAY_LOOK = 300.0


def state_dir_from_env(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The host's state directory: $SLOTQ_STATE_DIR, else
    $XDG_STATE_HOME/slotq/host, else ~/.local/state/slotq/host. A relative
    SLOTQ_STATE_DIR is refused (ConfigError): it would name a different
    queue in each working directory, and two runs started from two
    directories would hold "the" slot at once. A relative XDG_STATE_HOME is
    ignored, as the XDG spec asks."""
    env = os.environ if env is None else env
    explicit = env_path("SLOTQ_STATE_DIR", "another queue", env)
    if explicit:
        return explicit
    return os.path.join(xdg_state_home(env), "slotq", "host")


def state_dir_to_read() -> str:
    """state_dir_from_env(), for the commands that only read it (status,
    history, report): StateDirError if it names something that is not a
    directory -- they showed an empty history, or "Not a directory" of a
    slot file. One that does not exist yet is an empty queue."""
    path = state_dir_from_env()
    if os.path.exists(path) and not os.path.isdir(path):
        raise StateDirError(f"state directory {path} is not a directory", path)
    return path


def env_path(name: str, what: str, env: dict[str, str] | os._Environ[str] | None = None) -> str | None:
    """The absolute path in environment variable `name` (None if unset or
    empty). ConfigError if it is relative: it would name `what` in each
    working directory."""
    value = (os.environ if env is None else env).get(name)
    if not value:
        return None
    if not os.path.isabs(value):
        raise ConfigError(f"{name} must be an absolute path, not {value!r}: a relative one names {what} "
                          "in each working directory")
    return os.path.normpath(value)


def ledger_path() -> str:
    """The wait ledger's file: $SLOTQ_LEDGER (absolute: ConfigError if
    not), else the user's."""
    return ledger_env_path() or os.path.join(xdg_state_home(), "slotq", "ledger.sqlite")


def ledger_env_path() -> str | None:
    """$SLOTQ_LEDGER (ConfigError if relative), None if unset: for
    client/ledger.py, and for `slotq run` to check before the run starts
    without loading the ledger. A directory is refused too: the spool
    beside it would take the waits, and no reader could open the ledger."""
    path = env_path("SLOTQ_LEDGER", "another wait ledger")
    if path is not None and os.path.isdir(path):
        raise ConfigError(f"SLOTQ_LEDGER names a directory ({path}); it is the ledger's file, "
                          f"e.g. {os.path.join(path, 'ledger.sqlite')}")
    return path


def private_state_path(state_dir: str, kind: str, name: str) -> str:
    """A file of this user's own about the shared state dir `state_dir`, in
    the user's private state, beside the wait ledger (by default
    ~/.local/state/slotq/<kind>/<key>.<name>): never a name in the state
    dir itself, which another member can take first (issue 65). Each state
    dir has its own key (its real path)."""
    import hashlib

    key = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:16]
    return os.path.join(os.path.dirname(ledger_path()), kind, f"{key}.{name}")


def xdg_state_home(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """$XDG_STATE_HOME, else ~/.local/state (also when it is relative: the
    XDG spec asks that such a value be ignored)."""
    xdg = (os.environ if env is None else env).get("XDG_STATE_HOME")
    if not xdg or not os.path.isabs(xdg):
        xdg = os.path.join(os.path.expanduser("~"), ".local", "state")
    return xdg


def user_config() -> str | None:
    """Your own config file, if you have one: $XDG_CONFIG_HOME/slotq/config.toml
    (else ~/.config/slotq/config.toml; a relative XDG_CONFIG_HOME is ignored,
    as the XDG spec asks). It is read as a `$SLOTQ_CONFIG` is, which, when
    set, is used instead."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if not xdg or not os.path.isabs(xdg):
        xdg = os.path.join(os.path.expanduser("~"), ".config")
    path = os.path.join(xdg, "slotq", "config.toml")
    return path if os.path.lexists(path) else None


class HostConfig:
    """Pools, class -> pool mapping and host defaults."""

    __slots__ = ("pools", "classes", "budget", "kill_grace", "prepare_timeout", "path", "max_waiting",
                 "max_waiting_per_user", "warnings", "slurm", "retention", "wait_away", "away_look", "groups",
                 "attach_for")

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
        slurm: SlurmConfig | None = None,
        retention: float = DEFAULT_RETENTION,
        wait_away: bool = True,
        away_look: float = DEFAULT_AWAY_LOOK,
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
        self.warnings: list[str] = []  # e.g. a config file ignored as untrusted
        self.slurm = slurm or SlurmConfig()
        self.retention = retention  # how long the run history is kept, seconds
        # [waiting] away (host/away.py), away_look: how long a run waits away before it looks again
        self.wait_away, self.away_look = wait_away, away_look
        self.groups: dict[str, list[str]] = {}  # [groups] name -> hosts, `--host @name` (_from_dict sets it)
        # [defaults] attach_for: every `slotq run` is a kept run, attached at most this long (cli/run.py)
        self.attach_for: float | None = None
        where = f"host config {path}: " if path else ""
        for cls, pool in self.classes.items():
            if pool not in self.pools:
                raise ConfigError(f"{where}class {cls!r} maps to unknown pool {pool!r}", path)
        for pool in self.pools:
            if pool not in self.classes.values():
                # `[classes] shared = "landing"`: pool shared's own class taken
                # away, its slots would wait for runs that can never come.
                raise ConfigError(f"{where}pool {pool!r} is reached by no class (class {pool!r} maps to pool "
                                  f"{self.classes[pool]!r}): map a class to it, or remove the pool", path)

    @property
    def waiting_limits(self) -> tuple[int | None, int | None]:
        """[admission]: (waiting runs in a pool, of them one user's); None: no limit."""
        return self.max_waiting, self.max_waiting_per_user

    def pool_for(self, cls: str) -> str:
        """The pool that serves run class `cls`; KeyError if there is none."""
        return self.classes[cls]

    @classmethod
    def load(cls, path: str | None = None, state_dir: str | None = None) -> "HostConfig":
        """Read the host config; the defaults when no file exists.

        Which: `path`, else `$SLOTQ_CONFIG`, else yours (`user_config`),
        else the state directory's host.toml. Only a trusted file is used:
        a regular file owned by root or by the state directory's owner (or,
        for one of yours or an explicit path, by you), writable by nobody
        else. The state dir's host.toml
        is otherwise ignored, with a warning in `.warnings` naming the file
        and why (another user may have planted it); a file you named is a
        ConfigError.

        Raises ConfigError (with `.path`) for unreadable or invalid files.
        """
        state_dir = state_dir or state_dir_from_env()
        yours = None if path is not None else (os.environ.get("SLOTQ_CONFIG") or user_config())
        explicit = path is not None or yours is not None
        path = path or yours or os.path.join(state_dir, "host.toml")
        config = cls._read(path, state_dir, explicit)
        if yours is not None:
            config._agree_with_host(path, state_dir)
        return config

    def _agree_with_host(self, path: str, state_dir: str) -> None:
        """A `$SLOTQ_CONFIG` of your own must give the host's pools the sizes
        the host's own host.toml gives them: two runs that disagree would
        each take "the" slot of a one-slot pool (one reads it as two).
        ConfigError if not. The host's `[admission]` limits hold too: yours
        may tighten them, never loosen them (a member leaving them out
        would otherwise fill the line that the others are refused from).
        With no host.toml of the host's own (a private state dir, say), or
        an untrusted one, `$SLOTQ_CONFIG` decides."""
        own = os.path.join(state_dir, "host.toml")
        try:
            if os.path.samefile(own, path):
                return
        except OSError:
            return
        host = HostConfig._read(own, state_dir, False)
        if host.warnings:
            return
        for pool, slots in sorted(host.pools.items()):
            mine = self.pools.get(pool)
            if mine is not None and mine != slots:
                named = os.environ.get("SLOTQ_CONFIG") == path
                raise ConfigError(f"{'$SLOTQ_CONFIG' if named else 'your config'} ({path}) gives pool {pool!r} "
                                  f"{mine} slot(s), this host's own config ({own}) {slots}: runs that disagree "
                                  f"would hold its slots at once. "
                                  f"{'Unset SLOTQ_CONFIG' if named else 'Remove its [pools]'}, or make the two agree",
                                  path)
        self.max_waiting = _tighter(self.max_waiting, host.max_waiting)
        self.max_waiting_per_user = _tighter(self.max_waiting_per_user, host.max_waiting_per_user)

    @classmethod
    def _read(cls, path: str, state_dir: str, explicit: bool) -> "HostConfig":
        """One config file (`load`'s rules); the defaults if a file that was
        not named explicitly does not exist."""
        try:
            # A link is followed only where you named the file yourself.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if explicit else os.O_NOFOLLOW))
        except (FileNotFoundError, NotADirectoryError):
            if explicit:
                raise ConfigError(f"cannot read host config {path}: no such file", path) from None
            return cls()  # (no state dir yet, or an unusable one: the run says so, exit 73)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return cls._ignored(path, "it is a symbolic link (the state dir's host.toml must be a plain file)")
            raise ConfigError(f"cannot read host config {path}: {e.strerror}", path) from None
        try:
            st = os.fstat(fd)
            why = _untrusted(st, state_dir, explicit)
            if why and explicit:
                # You named it: running on the defaults instead (said only in
                # a warning, which -q hid) would not be the run you asked for.
                raise ConfigError(f"cannot use host config {path}: {why}", path)
            if why:
                return cls._ignored(path, why)
            if st.st_size > MAX_CONFIG:
                raise ConfigError(f"host config {path} is larger than {MAX_CONFIG} bytes", path)
            key = [os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            data = _cached(state_dir, key)
            if data is None:
                raw = os.read(fd, MAX_CONFIG + 1)
        except OSError as e:
            raise ConfigError(f"cannot read host config {path}: {e.strerror}", path) from None
        finally:
            os.close(fd)
        if data is None:
            # tomllib (and the `re` it imports) costs milliseconds on every
            # run; parse once, then read the parsed form back (see _cached).
            data = _parse_toml(raw, path)
            config = cls._from_dict(data, path)  # validate before caching
            _store(state_dir, key, data)
            return config
        return cls._from_dict(data, path)

    @classmethod
    def from_text(cls, raw: bytes, path: str) -> "HostConfig":
        """A config from a file's bytes (`slotq host init --config`, before
        it installs them); ConfigError if they are not a valid one."""
        return cls._from_dict(_parse_toml(raw, path), path)

    @classmethod
    def _ignored(cls, path: str, why: str) -> "HostConfig":
        config = cls()
        config.warnings.append(f"ignoring host config {path}: {why}; using the defaults")
        return config

    @classmethod
    def _from_dict(cls, data: dict[str, object], path: str | None) -> "HostConfig":
        unknown = set(data) - {"pools", "classes", "defaults", "admission", "slurm", "history", "waiting", "groups"}
        if unknown:
            raise ConfigError(f"host config {path}: unknown section(s) {sorted(unknown)}", path)
        pools = _pools(data.get("pools", DEFAULT_POOLS), path)
        classes_raw = data.get("classes", {})
        if not isinstance(classes_raw, dict) or not all(isinstance(v, str) for v in classes_raw.values()):
            raise ConfigError(f"host config {path}: [classes] must map class names to pool names", path)
        for name in classes_raw:
            if not _is_name(name):
                raise ConfigError(f"host config {path}: class name {name!r} must be 1-64 letters, digits, - or _",
                                  path)
        values, attach_for = _defaults(data.get("defaults", {}), path)
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
        slurm = SlurmConfig.from_dict(data.get("slurm", {}), path)
        hist = data.get("history", {})
        if not isinstance(hist, dict) or set(hist) - {"retention"}:
            raise ConfigError(f"host config {path}: [history] takes only retention = \"180d\"", path)
        try:
            retention = parse_duration(str(hist.get("retention", "180d")), what="[history] retention",
                                       limit=10 * 365 * 86400.0)
        except ValueError as e:
            raise ConfigError(f"host config {path}: {e}", path) from None
        waiting = data.get("waiting", {})
        if not isinstance(waiting, dict) or set(waiting) - {"away", "away_look"} \
                or not isinstance(waiting.get("away", True), bool):
            raise ConfigError(f"host config {path}: [waiting] takes only away = true or false and "
                              "away_look = \"5m\"", path)
        try:
            away_look = parse_duration(str(waiting.get("away_look", "5m")), what="[waiting] away_look",
                                       limit=86400.0)
        except ValueError as e:
            raise ConfigError(f"host config {path}: {e}", path) from None
        if away_look < 1.0:
            raise ConfigError(f"host config {path}: [waiting] away_look must be at least 1s", path)
        config = cls(pools, dict(classes_raw), path=path, slurm=slurm, retention=retention,
                     wait_away=bool(waiting.get("away", True)), away_look=away_look,
                     **values, **limits)  # type: ignore[arg-type]
        config.groups = _groups(data.get("groups", {}), path)
        config.attach_for = attach_for
        return config


def _pools(raw: object, path: str | None) -> dict[str, int]:
    """[pools]: name -> slot count (1..1024); ConfigError if not."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"host config {path}: [pools] must map pool names to slot counts", path)
    pools: dict[str, int] = {}
    for name, n in raw.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1 or n > 1024:
            raise ConfigError(f"host config {path}: pool {name!r} needs 1..1024 slots, got {n!r}", path)
        if not _is_name(name):
            raise ConfigError(f"host config {path}: pool name {name!r} must be 1-64 letters, digits, - or _", path)
        pools[name] = n
    return pools


def _defaults(raw: object, path: str | None) -> tuple[dict[str, float], float | None]:
    """[defaults]: budget, kill_grace, prepare_timeout (their values, the
    built-in ones where not set) and attach_for (None where not set)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"host config {path}: [defaults] must be a table", path)
    known = {"budget", "kill_grace", "prepare_timeout", "attach_for"}
    if set(raw) - known:
        raise ConfigError(f"host config {path}: unknown default(s) {sorted(set(raw) - known)}", path)
    values: dict[str, float] = {}
    attach_for = None
    try:
        if "attach_for" in raw:
            attach_for = parse_duration(str(raw["attach_for"]), what="[defaults] attach_for", allow_zero=True)
        for key, fallback in (("budget", DEFAULT_BUDGET), ("kill_grace", DEFAULT_KILL_GRACE),
                              ("prepare_timeout", DEFAULT_PREPARE_TIMEOUT)):
            values[key] = parse_duration(str(raw.get(key, fallback)), what=key, allow_zero=key == "kill_grace")
    except ValueError as e:
        raise ConfigError(f"host config {path}: {e}", path) from None
    return values, attach_for


def _groups(raw: object, path: str | None) -> dict[str, list[str]]:
    """[groups]: name -> a list of hosts (`--host @name`); ConfigError if not."""
    if not isinstance(raw, dict):
        raise ConfigError(f"host config {path}: [groups] must map group names to lists of hosts", path)
    groups: dict[str, list[str]] = {}
    for name, hosts in raw.items():
        if not _is_name(name):
            raise ConfigError(f"host config {path}: group name {name!r} must be 1-64 letters, digits, - or _", path)
        if not isinstance(hosts, list) or not hosts or len(hosts) > 64 or not all(
                isinstance(h, str) and h and not h.startswith(("-", "@")) and "," not in h and len(h) <= 255
                for h in hosts):
            raise ConfigError(f"host config {path}: group {name!r} must be a list of 1-64 host names "
                              "(as ssh knows them)", path)
        groups[name] = list(dict.fromkeys(hosts))
    return groups


# srun options that would break how slotq runs a job: one task, whose input
# and output slotq itself frames, in a job slotq names (to cancel it should
# the caller vanish), pending as srun says. Long names are matched by
# prefix, as srun (getopt) takes `--ntask=2` for `--ntasks=2`.
_ONE_TASK = "slotq runs one task per job: another's output would mix with it"
_STREAM = "slotq feeds the job's input and reads its output itself"
_SRUN_REFUSED = {
    "--ntasks": _ONE_TASK, "--ntasks-per-node": _ONE_TASK, "--ntasks-per-socket": _ONE_TASK,
    "--ntasks-per-core": _ONE_TASK, "--ntasks-per-gpu": _ONE_TASK, "--ntasks-per-tres": _ONE_TASK,
    "--multi-prog": _ONE_TASK, "--het-group": _ONE_TASK,
    "--output": _STREAM, "--input": _STREAM, "--label": _STREAM, "--pty": _STREAM, "--open-mode": _STREAM,
    "--job-name": "slotq names the job (slotq-<run id>), to cancel it should the caller vanish",
    "--quiet": "slotq reads srun's messages to know that the job is pending",
    "--test-only": "nothing would run",
}
_SRUN_SHORT = {"n": "--ntasks", "o": "--output", "i": "--input", "l": "--label", "J": "--job-name", "Q": "--quiet"}
_SRUN_FLAGS = "EHhkKlOQqsuvVXZ"  # short options without a value: `-lv` is -l and -v


def srun_option_problem(opt: str) -> str | None:
    """Why srun option `opt` (one word, as given to srun) cannot be used
    with slotq, or None if it can."""
    if opt.startswith("--"):
        name = opt.partition("=")[0]
        if len(name) > 2:
            for refused, why in _SRUN_REFUSED.items():
                if refused.startswith(name):
                    return f"{refused}: {why}"
        return None
    for ch in opt[1:]:
        if ch in _SRUN_SHORT:
            refused = _SRUN_SHORT[ch]
            return f"-{ch} ({refused}): {_SRUN_REFUSED[refused]}"
        if ch not in _SRUN_FLAGS:
            return None  # an option with a value: the rest is its value
    return None


class SlurmConfig:
    """The `[slurm]` section: how run classes map to Slurm partitions and
    QoS, options for every job, and how the nodes run slotq."""

    __slots__ = ("classes", "options", "slotq")

    def __init__(self, classes: dict[str, dict[str, str]] | None = None, options: list[str] | None = None,
                 slotq: list[str] | None = None) -> None:
        # `shared` with no mapping: Slurm's default partition.
        self.classes = {"shared": {}} if classes is None else classes
        self.options = options or []
        self.slotq = slotq

    def job_for(self, cls: str) -> dict[str, str]:
        """{"partition": ..., "qos": ...} (each optional) for run class
        `cls`; KeyError if the config names no such class."""
        return self.classes[cls]

    @classmethod
    def from_dict(cls, raw: object, path: str | None) -> "SlurmConfig":
        where = f"host config {path}: [slurm]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} must be a table", path)
        if set(raw) - {"classes", "options", "slotq"}:
            raise ConfigError(f"{where}: unknown setting(s) {sorted(set(raw) - {'classes', 'options', 'slotq'})}",
                              path)
        classes: dict[str, dict[str, str]] | None = None
        if "classes" in raw:
            table = raw["classes"]
            if not isinstance(table, dict):
                raise ConfigError(f"{where}.classes must map class names to {{ partition = ..., qos = ... }}", path)
            classes = {}
            for name, job in table.items():
                if not _is_name(name):
                    raise ConfigError(f"{where}.classes: class name {name!r} must be 1-64 letters, digits, - or _",
                                      path)
                if not isinstance(job, dict) or set(job) - {"partition", "qos"} or not all(
                        isinstance(v, str) and 0 < len(v) <= 200 and _is_slurm_name(v) for v in job.values()):
                    raise ConfigError(f"{where}.classes.{name} must be {{ partition = NAME, qos = NAME }} "
                                      "(both optional; names of letters, digits, -, _, .)", path)
                classes[name] = dict(job)
        options = raw.get("options", [])
        if not isinstance(options, list) or len(options) > 100 or not all(
                isinstance(o, str) and 0 < len(o) <= 1000 and o.startswith("-") and "\0" not in o for o in options):
            raise ConfigError(f"{where}.options must be a list of Slurm options, e.g. [\"--account=ci\"]", path)
        for o in options:
            why = srun_option_problem(o)
            if why:
                raise ConfigError(f"{where}.options: {o[:100]!r} cannot be used with slotq ({why})", path)
        slotq = raw.get("slotq")
        if isinstance(slotq, str):
            slotq = [slotq]
        if slotq is not None and (not isinstance(slotq, list) or not 0 < len(slotq) <= 20 or not all(
                isinstance(a, str) and 0 < len(a) <= 4096 and "\0" not in a for a in slotq)):
            raise ConfigError(f"{where}.slotq must be a path (or a list: a command and its arguments)", path)
        return cls(classes, options, slotq)


def _tighter(mine: int | None, host: int | None) -> int | None:
    """The stricter of two limits (None: no limit)."""
    if mine is None or host is None:
        return host if mine is None else mine
    return min(mine, host)


def _parse_toml(raw: bytes, path: str) -> dict[str, object]:
    import tomllib

    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"host config {path} is not valid TOML: {e}", path) from None


def _is_slurm_name(name: str) -> bool:
    return all(c.isalnum() or c in "-_." for c in name)


def _is_name(name: str) -> bool:
    # A pool's name is part of its state files' names; a class's is typed
    # on command lines and shown in status.
    return 0 < len(name) <= 64 and all(c.isalnum() or c in "-_" for c in name)


MAX_CONFIG = 256 * 1024


def _untrusted(st: os.stat_result, state_dir: str, explicit: bool) -> str | None:
    """Why a config file may not be used, or None if it may."""
    import stat

    from .procinfo import user_name

    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    me = os.getuid()
    try:
        dir_owner: int | None = os.stat(state_dir).st_uid
    except OSError:
        dir_owner = None
    trusted = {0, me} if explicit or dir_owner is None else {0, dir_owner}
    if st.st_uid not in trusted:
        return (f"it belongs to {user_name(st.st_uid)} (uid {st.st_uid}), not to root or the state dir's owner "
                "(anyone could have planted it)")
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and (st.st_uid != me or explicit)):
        # Your own $SLOTQ_CONFIG too: whoever can write it decides your pools.
        return f"it is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod go-w it"
    return None


_CACHE = ".host-config.cache"
MAX_CACHE = 256 * 1024


def _cache_path(state_dir: str) -> str:
    # One per user: a cache another user wrote is not trusted.
    return os.path.join(state_dir, f"{_CACHE}.{os.getuid()}")


def _cache_file(state_dir: str) -> str:
    """Where this user's cache is: its name in the state dir (one stat on
    `slotq run`'s start), or, if another member took that name first, in
    the user's private state."""
    path = _cache_path(state_dir)
    try:
        if os.lstat(path).st_uid != os.getuid():
            return private_state_path(state_dir, "host-config", "cache")
    except OSError:
        pass
    return path


def _cached(state_dir: str, key: list[object]) -> dict[str, object] | None:
    """The parsed config if this user's cache was made from this very file
    (path, device, inode, size, mtime, ctime); else None. The cache must be
    this user's own regular file, writable by nobody else; it is JSON, read
    with limits (size, depth)."""
    from .records import from_json
    from .statefile import read_private

    raw = read_private(_cache_file(state_dir), MAX_CACHE)
    if raw is None:
        return None
    try:
        cached = from_json(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one too
        return None
    if not isinstance(cached, dict) or cached.get("key") != key:
        return None
    data = cached.get("data")
    return data if isinstance(data, dict) else None


def _store(state_dir: str, key: list[object], data: dict[str, object]) -> None:
    from .records import to_json
    from .statefile import write_private

    try:
        text = to_json({"key": key, "data": data})
    except TypeError:
        return  # a value JSON cannot hold (a TOML date): no cache, parse each time
    path = _cache_file(state_dir)
    if path != _cache_path(state_dir):
        from .statefile import make_private_dirs

        try:
            make_private_dirs(os.path.dirname(path))
        except OSError:
            return
    write_private(path, text.encode())
