"""scripts/write_launcher.py TEMPLATE LAUNCHER -- write the `slotq` command
(bin/slotq) so that it starts without `site`: `#!<this python> -S`.

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


def main(template: str, launcher: str) -> int:
    where = os.path.dirname(os.path.dirname(os.path.abspath(slotq.__file__)))
    python = os.path.abspath(sys.executable)
    shebang = f"#!{python} -S"
    if len(shebang) > 127 or any(c.isspace() for c in python):
        print(f"write_launcher: {python}: too long or spaced for a #! line; pip's launcher stays", file=sys.stderr)
        return 0
    with open(template, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines[0] != "#!python" or lines.count('SLOTQ_PATH = ""') != 1:
        print(f"write_launcher: {template} is not slotq's launcher template", file=sys.stderr)
        return 1
    lines[0] = shebang
    lines[lines.index('SLOTQ_PATH = ""')] = f"SLOTQ_PATH = {where!r}"
    tmp = f"{launcher}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.chmod(tmp, 0o755)
    os.replace(tmp, launcher)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: write_launcher.py TEMPLATE LAUNCHER", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
