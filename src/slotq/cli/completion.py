"""`slotq completion bash|zsh|fish`: a shell completion script, made from
the commands' own option tables (so it never falls behind them)."""

from __future__ import annotations

import sys

from slotq.cli.args import FLAG, Opt, Parser
from slotq.errors import UsageError

PARSER = Parser(
    prog="slotq completion", usage="slotq completion bash|zsh|fish",
    description="Print a completion script for your shell. Install it with, e.g.:\n"
                "  bash: slotq completion bash > ~/.local/share/bash-completion/completions/slotq\n"
                "  zsh:  slotq completion zsh > ~/.zfunc/_slotq   (with fpath+=(~/.zfunc) before compinit)\n"
                "  fish: slotq completion fish > ~/.config/fish/completions/slotq.fish",
    options=[], command="optional",
)

SHELLS = ("bash", "zsh", "fish")


def main(args: list[str]) -> int:
    _, words = PARSER.parse(args)
    if len(words) != 1:
        raise UsageError(f"name one shell ({', '.join(SHELLS)}), not {len(words)}: {' '.join(words)}"
                         if words else f"name your shell: {', '.join(SHELLS)}")
    if words[0] not in SHELLS:
        raise UsageError(f"{words[0]!r} is not a shell slotq completes ({', '.join(SHELLS)})")
    sys.stdout.write({"bash": bash, "zsh": zsh, "fish": fish}[words[0]](commands()))
    return 0


def commands() -> dict[str, tuple[str, list[Opt]]]:
    """command -> (one-line description, its options)."""
    from slotq.cli import COMMANDS, USAGE

    about = {}
    for line in USAGE.splitlines():
        parts = line.split(None, 1)
        if line.startswith("  ") and len(parts) == 2 and parts[0] in COMMANDS:
            about[parts[0]] = parts[1].split(":")[0].strip()
    out = {}
    for name, module in COMMANDS.items():
        parser = getattr(__import__(module, fromlist=["PARSER"]), "PARSER", None)
        options = list(parser.options) if isinstance(parser, Parser) and name != "host" else []
        out[name] = (about.get(name, name), [*options, Opt("--help", "-h", kind=FLAG, help="show help")])
    return out


def _takes_value(o: Opt) -> bool:
    return o.kind != FLAG


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def bash(cmds: dict[str, tuple[str, list[Opt]]]) -> str:
    cases = []
    for name, (_, opts) in cmds.items():
        words = " ".join(n for o in opts for n in o.names)
        valued = "|".join(n for o in opts if _takes_value(o) and not o.suggest for n in o.names) or "--none--"
        choices = "".join(f"        {'|'.join(o.names)}) COMPREPLY=($(compgen -W {_quote(' '.join(o.suggest))} "
                          f"-- \"$cur\")); return;;\n" for o in opts if o.suggest)
        cases.append(f"    {name})\n      case \"$prev\" in\n{choices}"
                     f"        {valued}) COMPREPLY=($(compgen -f -- \"$cur\")); return;;\n      esac\n"
                     f"      COMPREPLY=($(compgen -W {_quote(words)} -- \"$cur\"));;\n")
    return ("# slotq completion for bash (slotq completion bash)\n"
            "_slotq() {\n"
            "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd=${COMP_WORDS[1]} i\n"
            "  for ((i = 2; i < COMP_CWORD; i++)); do\n"
            "    if [[ ${COMP_WORDS[i]} == -- ]]; then COMPREPLY=($(compgen -c -- \"$cur\")); return; fi\n"
            "  done\n"
            "  if ((COMP_CWORD == 1)); then\n"
            f"    COMPREPLY=($(compgen -W {_quote(' '.join(cmds))} -- \"$cur\")); return\n"
            "  fi\n"
            "  case \"$cmd\" in\n" + "".join(cases) + "  esac\n"
            "}\n"
            "complete -o default -F _slotq slotq\n")


def zsh(cmds: dict[str, tuple[str, list[Opt]]]) -> str:
    def spec(o: Opt) -> str:
        text = o.help.replace("[", "(").replace("]", ")").replace("'", "")[:80].replace(":", " ")
        names = o.names if len(o.names) == 1 else ("{" + ",".join(o.names) + "}",)
        value = ""
        if _takes_value(o):
            meta = "".join(c for c in o.metavar.split("[")[0].lower() if c.isalnum() or c in "-_") or "value"
            value = f":{meta}:" + (f"({' '.join(o.suggest)})" if o.suggest else "_files")
        return f"'{names[0]}[{text}]{value}'" if len(o.names) == 1 else f"{names[0]}'[{text}]{value}'"

    cases = "".join(f"    {name})\n      _arguments {' '.join(spec(o) for o in opts)} '*::command:_normal';;\n"
                    for name, (_, opts) in cmds.items())
    listing = " ".join(_quote(f"{name}:{about.replace(':', ' ')}") for name, (about, _) in cmds.items())
    return ("#compdef slotq\n# slotq completion for zsh (slotq completion zsh)\n"
            "_slotq() {\n"
            "  if (( CURRENT == 2 )); then\n"
            f"    local -a commands=({listing})\n"
            "    _describe command commands; return\n"
            "  fi\n"
            "  local cmd=$words[2]\n"
            "  shift words; (( CURRENT-- ))\n"
            "  case $cmd in\n" + cases + "  esac\n"
            "}\n"
            "compdef _slotq slotq\n")


def fish(cmds: dict[str, tuple[str, list[Opt]]]) -> str:
    lines = ["# slotq completion for fish (slotq completion fish)", "complete -c slotq -f"]
    for name, (about, opts) in cmds.items():
        lines.append(f"complete -c slotq -n __fish_use_subcommand -a {name} -d {_quote(about)}")
        for o in opts:
            flags = " ".join(f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}" for n in o.names)
            value = (f" -x -a {_quote(' '.join(o.suggest))}" if o.suggest else " -r -F") if _takes_value(o) else ""
            lines.append(f"complete -c slotq -n '__fish_seen_subcommand_from {name}' {flags}{value} "
                         f"-d {_quote(o.help[:80])}")
    return "\n".join(lines) + "\n"
