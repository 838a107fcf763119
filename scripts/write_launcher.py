"""scripts/write_launcher.py TEMPLATE LAUNCHER [BUNDLE] -- write the `slotq`
command (bin/slotq) so that it starts without `site`: `#!<this python> -S`,
and the bundle of the modules a run imports that it reads (slotq/bundle.py;
by default beside the package's .pyc files).

slotq needs nothing but the standard library and itself, and `site`
(site-packages, .pth files, setuptools' distutils hook) costs about 1.5 ms
of every `slotq run` (docs/performance.md). The launcher names the directory
this python imports slotq from (an editable install's src/, or
site-packages). Where a #! line cannot hold the interpreter's path and a
flag (longer than 127 bytes, or with spaces), pip's launcher stays.
Run it with the python slotq is installed for (scripts/install does).
"""

import os
import sys

import slotq
from slotq import bundle


def main(template: str, launcher: str, bundle_path: str | None = None) -> int:
    package = os.path.dirname(os.path.abspath(slotq.__file__))
    where = os.path.dirname(package)
    if bundle_path is None:
        bundle_path = os.path.join(package, "__pycache__", f"run.{sys.implementation.cache_tag}.bundle")
    python = os.path.abspath(sys.executable)
    shebang = f"#!{python} -S"
    if len(shebang) > 127 or any(c.isspace() for c in python):
        print(f"write_launcher: {python}: too long or spaced for a #! line; pip's launcher stays", file=sys.stderr)
        return 0
    with open(template, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines[0] != "#!python" or lines.count('SLOTQ_PATH = ""') != 1 or lines.count('BUNDLE = ""') != 1:
        print(f"write_launcher: {template} is not slotq's launcher template", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(bundle_path)), exist_ok=True)
    bundle.write(bundle_path)
    lines[0] = shebang
    lines[lines.index('SLOTQ_PATH = ""')] = f"SLOTQ_PATH = {where!r}"
    lines[lines.index('BUNDLE = ""')] = f"BUNDLE = {os.path.abspath(bundle_path)!r}"
    tmp = f"{launcher}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.chmod(tmp, 0o755)
    os.replace(tmp, launcher)
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        print("usage: write_launcher.py TEMPLATE LAUNCHER [BUNDLE]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
