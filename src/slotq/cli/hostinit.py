"""`slotq host init --shared DIR --group G`: a state directory several users
share safely (run as root).

What it makes, and why (the trust model is in the README):

    DIR, DIR/slots, DIR/tickets, DIR/tickets/<pool>, DIR/work, DIR/history
        root:G, mode 3775 -- group members create files there; the sticky
        bit means nobody deletes or renames another user's files (their
        tickets, their work dir); setgid keeps files in group G.
    DIR/slots/<pool>.<i>, DIR/seq, DIR/history.jsonl (the run history's spool)
        root:G, mode 0660 -- every member locks and writes them; nobody can
        delete or replace them, so a slot lock cannot be split in two.
    DIR/host.toml
        root:root, mode 0644 -- only a config of root (or of the state dir's
        owner) is ever used.
    DIR/layout
        root:root, mode 0644 -- the state dir's layout version (hostqueue.LAYOUT).

Run again after changing the pools in host.toml: it is idempotent, and it
replaces any slot file, counter or history file that is not root's own
regular file (a link or a file someone planted).
"""

from __future__ import annotations

import grp
import os
import stat
import sys

from slotq.cli.args import Opt, Parser
from slotq.errors import SlotqError, UsageError

DEFAULT_CONFIG = """\
# slotq host config (made by `slotq host init`; edit as root, then run it again)
[pools]            # pool -> number of slots
shared = 1
landing = 1

[classes]          # extra run classes -> pool; each pool is also a class
merge = "landing"

[defaults]
budget = "60m"
kill_grace = "10s"
prepare_timeout = "10m"
"""

PARSER = Parser(
    prog="slotq host init", usage="slotq host init --shared DIR --group GROUP [--config FILE]",
    description="As root: create (or repair) a state directory that the members of GROUP share safely: "
                "sticky, root-owned directories and lock files, a root-owned host.toml. Then have the "
                "users set SLOTQ_STATE_DIR=DIR.",
    options=[
        Opt("--shared", metavar="DIR", help="the shared state directory to create or repair: a new or empty "
                                             "directory, or a slotq state dir"),
        Opt("--group", metavar="GROUP", help="the group whose members share it (a name, or a gid)"),
        Opt("--config", metavar="FILE", help="install FILE as DIR/host.toml (default: keep the one there, "
                                              "or write the defaults)"),
    ],
)


class NotRoot(SlotqError):
    exit_code = 77  # EX_NOPERM


def _group(name: str) -> grp.struct_group:
    """The group named `name`, or with the gid `name` (as chgrp(1) takes
    one); a usage error if there is none."""
    try:
        return grp.getgrnam(name)
    except KeyError:
        pass
    try:
        if name.isascii() and name.isdigit():
            return grp.getgrgid(int(name))
    except (KeyError, OverflowError):
        pass
    raise UsageError(f"no group named {name!r}")


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    if not opts.shared or not opts.group:
        raise PARSER.error("--shared DIR and --group GROUP are both needed")
    if os.geteuid() != 0:
        raise NotRoot("slotq host init must run as root (it makes files owned by root)")
    group = _group(opts.group)
    gid = group.gr_gid
    text = _read_config(opts.config) if opts.config is not None else None
    top = os.path.abspath(opts.shared)
    _check_top(top)
    done = init_shared(top, gid, text)
    for line in done:
        print(line)
    print(f"shared state dir ready: tell the members of group {group.gr_name} to use it with\n"
          f"  export SLOTQ_STATE_DIR={top}")
    return 0


def _check_top(top: str) -> None:
    """`top` must be new, empty, or a slotq state dir already: init chowns
    it to root and makes it mode 3775, which a typo such as `--shared /tmp`
    or `--shared /var/lib` must never do to a directory the system uses."""
    try:
        names = set(os.listdir(top))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise UsageError(f"--shared {top} exists and is not a directory") from None
    except OSError as e:
        raise UsageError(f"--shared {top}: cannot list it: {e.strerror}") from None
    if names and not names & {"seq", "slots", "tickets", "host.toml"}:
        raise UsageError(f"--shared {top} has files and is not a slotq state dir (no seq, slots, tickets or "
                         "host.toml in it): name a new or empty directory; nothing was changed")


def _read_config(src: str) -> bytes:
    """The text of `--config FILE`, read and checked before anything is made
    or replaced: a bad file must not become every member's host.toml."""
    from slotq.config import MAX_CONFIG, HostConfig
    from slotq.errors import ConfigError

    try:
        with open(src, "rb") as f:
            text = f.read(MAX_CONFIG + 1)
    except OSError as e:
        raise UsageError(f"--config {src}: cannot read it: {e.strerror}") from None
    if len(text) > MAX_CONFIG:
        raise UsageError(f"--config {src}: larger than {MAX_CONFIG} bytes")
    try:
        HostConfig.from_text(text, src)
    except ConfigError as e:
        raise UsageError(f"--config: {e} (nothing was made or replaced)") from None
    return text


def init_shared(top: str, gid: int, config_text: bytes | None) -> list[str]:
    from slotq.config import HostConfig
    from slotq.errors import ConfigError

    done: list[str] = []
    os.makedirs(os.path.dirname(top), exist_ok=True)
    _dir(top, gid, done)
    cfg = os.path.join(top, "host.toml")
    if config_text is not None:
        _file(cfg, 0, 0o644, done, content=config_text, replace=True)
    elif _is_root_file(cfg):
        _file(cfg, 0, 0o644, done)
    else:
        _file(cfg, 0, 0o644, done, content=DEFAULT_CONFIG.encode(), replace=True)
    try:
        config = HostConfig.load(path=cfg, state_dir=top)
    except ConfigError as e:
        raise UsageError(f"the config is not valid: {e}") from None
    for sub in ("slots", "tickets", "work", "history"):
        _dir(os.path.join(top, sub), gid, done)
    for pool, count in config.pools.items():
        _dir(os.path.join(top, "tickets", pool), gid, done)
        for i in range(count):
            _file(os.path.join(top, "slots", f"{pool}.{i}"), gid, 0o660, done)
    _file(os.path.join(top, "seq"), gid, 0o660, done, content=b"%020d\n" % 0)
    _file(os.path.join(top, "history.jsonl"), gid, 0o660, done)
    from slotq.host.layout import LAYOUT, layout_of

    if layout_of(top) != LAYOUT:
        _file(os.path.join(top, "layout"), 0, 0o644, done, content=b"%d\n" % LAYOUT, replace=True)
    return done


def _dir(path: str, gid: int, done: list[str]) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, 0o700)
        done.append(f"made {path}")
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{path} exists and is not a directory (a link?): remove it first")
    os.chown(path, 0, gid, follow_symlinks=False)
    os.chmod(path, 0o3775)


def _is_root_file(path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0


def _file(path: str, gid: int, mode: int, done: list[str], content: bytes | None = None,
          replace: bool = False) -> None:
    """A root-owned regular file at `path`; anything else there (a link, a
    FIFO, another user's file) is removed first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_uid != 0):
        os.unlink(path)
        done.append(f"removed {path}: it was not root's own regular file")
        st = None
    if st is None or replace:
        tmp = f"{path}.init.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if content:
                os.write(fd, content)
            elif st is not None:
                with open(path, "rb") as f:
                    os.write(fd, f.read())
        finally:
            os.close(fd)
        os.chown(tmp, 0, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        done.append(f"wrote {path}")
    else:
        os.chown(path, 0, gid, follow_symlinks=False)
        os.chmod(path, mode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
