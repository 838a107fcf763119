"""Pure logic on a fake clock: durations, outcomes, watchdogs, framing, config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slotq import protocol
from slotq.client.watchdogs import BACKSTOP_MARGIN, Watchdogs
from slotq.clock import FakeClock
from slotq.config import HostConfig
from slotq.durations import format_duration, parse_duration
from slotq.errors import ConfigError, ProtocolError
from slotq.outcome import EXIT_CODES, Outcome, exit_code_for


@pytest.mark.parametrize("text,seconds", [
    ("45", 45), ("45s", 45), ("1.5s", 1.5), ("15m", 900), ("1h30m", 5400), ("2m30s", 150),
    ("250ms", 0.25), (" 10S ", 10), ("1h", 3600),
])
def test_parse_duration_accepts_what_people_type(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text,needle", [
    ("", "empty"), ("-5", "negative"), ("-1m", "negative"), ("1x", "unknown unit"), ("abc", "cannot read"),
    ("30m1h", "out of order"), ("0", "more than zero"), ("1.2.3s", "cannot read"), ("5 m", "cannot read"),
])
def test_parse_duration_rejects_garbage_with_a_clear_message(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_duration(text, what="--budget")


def test_format_duration_is_short() -> None:
    assert [format_duration(x) for x in (0.25, 12.34, 245, 3720, 86399, 29 * 86400 + 3 * 3600 + 59)] == \
        ["250ms", "12.3s", "4m05s", "1h02m", "23h59m", "29d03h"]  # a 29-day budget was "696h00m"


def test_exit_codes_are_distinct_and_timeout_is_124() -> None:
    fixed = [c for c in EXIT_CODES.values() if c is not None]
    assert len(fixed) == len(set(fixed))
    assert EXIT_CODES[Outcome.EXEC_TIMEOUT] == 124
    assert 2 not in fixed and 73 not in fixed and 78 not in fixed
    assert exit_code_for(Outcome.PASSED, 0) == 0
    assert exit_code_for(Outcome.FAILED, 3) == 3
    assert exit_code_for(Outcome.FAILED, None) == 1


def test_every_outcome_names_whom_it_blames() -> None:
    assert {o.blame for o in Outcome.members()} <= {"work", "infrastructure", "caller", "task", "none"}
    # `detached` is not an ending (a kept run goes on): the one outcome that blames nobody.
    assert [o for o in Outcome.members() if o.blame == "none"] == [Outcome.DETACHED]
    assert Outcome.BACKSTOP.blame == "infrastructure" and Outcome.EXEC_TIMEOUT.blame == "work"


def test_backstop_is_created_at_slot_and_is_budget_plus_90() -> None:
    clock = FakeClock()
    dogs = Watchdogs(clock, idle=None)
    clock.advance(450)  # a long wait in line: no timer exists, nothing can fire
    assert dogs.expired() is None and clock.timers == []
    dogs.on_slot(budget=1.0)
    assert [(t.name, t.length) for t in clock.timers] == [("backstop", 1.0 + BACKSTOP_MARGIN)]
    assert clock.timers[0].created == clock.monotonic()
    clock.advance(90.9)
    assert dogs.expired() is None
    clock.advance(0.2)
    assert dogs.expired() is Outcome.BACKSTOP


def test_prepare_time_moves_the_backstop_later() -> None:
    clock = FakeClock()
    dogs = Watchdogs(clock, idle=None)
    dogs.on_slot(budget=10)
    clock.advance(60)
    dogs.on_prepared(took=60)
    clock.advance(99)
    assert dogs.expired() is None
    clock.advance(2)
    assert dogs.expired() is Outcome.BACKSTOP


def test_idle_watchdog_counts_only_after_start_and_output_resets_it() -> None:
    clock = FakeClock()
    dogs = Watchdogs(clock, idle=5)
    dogs.on_slot(budget=600)
    clock.advance(30)  # quiet queue + prepare time
    assert dogs.expired() is None
    dogs.on_started()
    clock.advance(4)
    dogs.on_output()
    clock.advance(4)
    assert dogs.expired() is None
    clock.advance(1.5)
    assert dogs.expired() is Outcome.IDLE_TIMEOUT
    assert dogs.expired() is None  # fires once


class _Clocks:
    """The clocks of one path -- the caller's (client/events.py) or a kept
    run's stand-in (client/standin.py) -- fed the host's events on a fake
    clock: what fired, in the words each path acts on."""

    def __init__(self, path: str, tmp: str, idle: float | None) -> None:
        self.clock = FakeClock()
        self.path = path
        if path == "caller":
            from slotq.client.result import RunResult
            from slotq.spec import RunSpec

            self.dogs = Watchdogs(self.clock, idle)
            self.spec = RunSpec(["true"], budget=10)
            self.result = RunResult(self.spec, "h")
        else:
            from slotq.client.standin import StandIn

            self.said_r, said_w = os.pipe()
            os.set_blocking(self.said_r, False)
            self.standin = StandIn(tmp, None, said_w, {"idle": idle, "kill_grace": 1.0, "lease_s": 1e10},  # type: ignore[arg-type]
                                   self.clock, "r", "h")

    def event(self, name: str, **fields: object) -> None:
        ev = {"event": name, "at": self.clock.wall(), **fields}
        if self.path == "caller":
            from slotq.client.events import on_event, silent

            on_event(ev, self.result, self.dogs, silent, self.spec)
        else:
            import json

            self.standin._on_event(name, json.dumps(ev).encode())

    def fired(self) -> str | None:
        if self.path == "caller":
            out = self.dogs.expired()
            return None if out is None else out.value
        self.standin._keep_clocks()
        try:
            said = os.read(self.said_r, 100).decode()
        except BlockingIOError:
            return None
        return said.strip().removeprefix("cancel ")


@pytest.mark.parametrize("path", ["caller", "stand-in"])
def test_each_clock_has_one_rule_on_both_paths_that_keep_it(path: str, tmp_path: Path) -> None:
    # The caller and a kept run's stand-in each wrote the rule: a stand-in
    # that counted --idle in line (a mutant) passed the whole suite.
    idle = _Clocks(path, str(tmp_path), idle=5.0)
    idle.event(protocol.QUEUED, ahead=3)
    idle.clock.advance(450)  # a long wait in line: nothing counts
    assert idle.fired() is None
    idle.event(protocol.SLOT, slot="shared#0", budget=10.0, waited_s=450.0)
    idle.clock.advance(30)  # a prepare step: its own limit, not --idle
    idle.event(protocol.PREPARED, ok=True)
    assert idle.fired() is None
    idle.event(protocol.STARTED, budget=10.0)
    idle.clock.advance(4.9)
    assert idle.fired() is None
    idle.clock.advance(0.2)
    assert idle.fired() == "idle_timeout"
    backstop = _Clocks(path, str(tmp_path), idle=None)
    backstop.event(protocol.QUEUED, ahead=3)
    backstop.clock.advance(450)
    backstop.event(protocol.SLOT, slot="shared#0", budget=10.0, waited_s=450.0)
    backstop.clock.advance(30)
    backstop.event(protocol.PREPARED, ok=True)  # the backstop moves on by the prepare step's time
    backstop.event(protocol.STARTED, budget=10.0)
    backstop.clock.advance(10 + BACKSTOP_MARGIN - 0.1)
    assert backstop.fired() is None
    backstop.clock.advance(0.2)
    assert backstop.fired() == "backstop"


def test_the_clocks_rule_is_written_once() -> None:
    # Only Watchdogs.on_event starts a clock from the host's events.
    import re

    src = Path(__file__).resolve().parent.parent / "src" / "slotq"
    starts = [f"{p.relative_to(src)}" for p in sorted(src.rglob("*.py"))
              if re.search(r"\.on_(slot|prepared|started)\(", p.read_text())
              and p.name != "watchdogs.py"]
    assert starts == []


def test_timer_never_moves_earlier() -> None:
    t = FakeClock().timer("x", 10)
    before = t.deadline
    t.extend(-5)
    assert t.deadline == before


def _stream(*frames: bytes) -> bytes:
    return protocol.MAGIC + b"".join(frames)


def test_decoder_handles_any_split_and_keeps_bytes_exact() -> None:
    blob = bytes(range(256)) * 3
    data = b"login banner\n" + _stream(
        protocol.frame(protocol.STDOUT, blob),
        protocol.event_frame("slot", 1.0, slot="shared#0"),
        protocol.frame(protocol.STDERR, b"err"),
    )
    for cut in (1, 2, 3, 7, 64, len(data)):
        dec = protocol.Decoder()
        got: list[object] = []
        for i in range(0, len(data), cut):
            got += dec.feed(data[i:i + cut])
        assert got == [(b"O", blob), (b"V", {"event": "slot", "at": 1.0, "slot": "shared#0"}), (b"E", b"err")]
        assert bytes(dec.noise) == b"login banner\n"


def test_command_output_that_imitates_an_event_stays_output() -> None:
    forged = protocol.MAGIC + protocol.event_frame("slot", 1.0, slot="x") + b"slot acquired\n"
    dec = protocol.Decoder()
    frames = dec.feed(_stream(protocol.frame(protocol.STDOUT, forged)))
    assert frames == [(b"O", forged)]


def test_decoder_rejects_other_protocol_versions_and_corruption() -> None:
    with pytest.raises(ProtocolError, match="protocol 99"):
        protocol.Decoder().feed(b"\x00SLOTQ-STREAM 99\n")
    with pytest.raises(ProtocolError, match="corrupt"):
        protocol.Decoder().feed(protocol.MAGIC + b"Z\x00\x00\x00\x01x")


def test_config_defaults_and_class_mapping(tmp_path: os.PathLike[str]) -> None:
    cfg = HostConfig.load(path=None, state_dir=str(tmp_path))
    assert cfg.pools == {"shared": 1, "landing": 1}
    assert cfg.pool_for("landing") == "landing"
    path = os.path.join(tmp_path, "h.toml")
    with open(path, "w") as f:
        f.write('[pools]\nshared = 2\nlanding = 1\n[classes]\nmerge = "landing"\n[defaults]\nbudget = "5m"\n')
    cfg = HostConfig.load(path=path, state_dir=str(tmp_path))
    assert cfg.pools["shared"] == 2 and cfg.pool_for("merge") == "landing" and cfg.budget == 300


@pytest.mark.parametrize("text,needle", [
    ("[pools]\nshared = 0\n", "1..1024"),
    ('[classes]\nmerge = "nowhere"\n', "unknown pool"),
    # Pool shared's own class taken away: its slots waited for runs none could send.
    ('[classes]\nshared = "landing"\n', "pool 'shared' is reached by no class .class 'shared' maps to pool "
                                         "'landing'.: map a class to it, or remove the pool"),
    ("[pools\n", "not valid TOML"),
    ('[defaults]\nbudget = "-1"\n', "negative"),
    ("[extra]\n", "unknown section"),
    ('[classes]\n"x y" = "shared"\n', "class name 'x y' must be"),
    ('[classes]\n"" = "shared"\n', "class name '' must be"),
    # Pool names are part of file names: one too long made every run an
    # "unusable state directory" (exit 73) instead of a bad config.
    ("[pools]\n" + "p" * 65 + " = 1\n", "pool name 'p+' must be 1-64"),
    ('[slurm]\noptions = ["--account=ci", "--output=/tmp/x"]\n',
     "options: '--output=/tmp/x' cannot be used with slotq .--output: slotq feeds"),
])
def test_bad_config_is_a_config_error_naming_the_file(tmp_path: os.PathLike[str], text: str, needle: str) -> None:
    path = os.path.join(tmp_path, "bad.toml")
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ConfigError, match=needle) as e:
        HostConfig.load(path=path)
    assert e.value.path == path and path in str(e.value)


def test_outcome_values_are_interned_strings() -> None:
    assert Outcome("passed") is Outcome.PASSED and Outcome.PASSED == "passed"
    assert str(Outcome.EXEC_TIMEOUT) == "exec_timeout" and repr(Outcome.BACKSTOP) == "Outcome.BACKSTOP"
    assert len(Outcome.members()) == 13
    with pytest.raises(ValueError, match="not an outcome"):
        Outcome("exploded")


@pytest.fixture(params=["hand-written", "C scanner"])
def json_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """records.from_json and to_json with each of their two implementations
    (the hand-written ones serve a local run's start, the C ones the rest)."""
    from slotq import records

    monkeypatch.setattr(records, "_scan", None)
    monkeypatch.setattr(records, "_encode", None)
    if request.param == "C scanner":
        records.load_scanner()
        assert records._scan is not None
    return str(request.param)


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [1.5, None, True, False], "c": {"d": "é ✓ \u65e5"}},
    {"q": 'quote " backslash \\ newline \n tab \t ctl \x01 del \x7f'},
    [], {}, "plain", 0, -3, 1e-300, -0.5, 12e30, ["[{", "}]", '\\"[', {"x": "\\"}],
])
def test_records_json_is_plain_json_both_ways(value: object, json_parser: str) -> None:
    import json

    from slotq.records import from_json, to_json

    assert json.loads(to_json(value)) == value
    assert from_json(to_json(value)) == value
    assert from_json(json.dumps(value, indent=2)) == value


@pytest.mark.parametrize("bad", ["{", "[1,", '{"a" 1}', "tru", '"abc', "1 2", '"\\x"', "", "  ", "[1,]", '{"a":1,}',
                                 "01", "+1", "1.", ".5", "1e", "1e+-5", "-", "NaN", "Infinity", "-Infinity",
                                 '"raw\ncontrol"', '"tab\there"', '{"a":1}x', "[1 2]", "9" * 5000])
def test_records_json_reader_rejects_malformed_input(bad: str, json_parser: str) -> None:
    from slotq.records import from_json

    with pytest.raises(ValueError) as e:
        from_json(bad)
    assert str(e.value)  # a message to show, never an empty one


def test_records_json_reader_limits_depth_not_brackets_in_strings(json_parser: str) -> None:
    from slotq.records import from_json

    assert from_json("[" * 32 + "]" * 32) == from_json("[" * 32 + "]" * 32, 32)
    for deep in ("[" * 33 + "]" * 33, "[" * 5000, '{"a":' * 40 + "1" + "}" * 40, "[" * 200000 + "]" * 200000):
        with pytest.raises(ValueError, match="nested too deeply"):
            from_json(deep)
    assert from_json('[[["a", 1]]]', 3) == [[["a", 1]]]
    with pytest.raises(ValueError, match="nested too deeply"):
        from_json('[[["a", 1]]]', 2)
    # Brackets inside strings, escaped quotes and backslashes among them, do not nest.
    flat = '["' + "[{" * 100 + '", "\\"[[[", "\\\\", "[[[[\\\\\\"[[["]'
    assert from_json(flat, 1) == ["[{" * 100, '"[[[', "\\", '[[[[\\"[[[']
    with pytest.raises(ValueError, match="nested too deeply"):
        from_json('["\\\\", [["x"]]]', 2)  # an escaped backslash must not hide a quote's end


def test_records_json_reader_is_strict_in_both_parsers_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever the parser, the same text means the same thing or is refused.
    from slotq import records

    monkeypatch.setattr(records, "_scan", None)

    texts = ['{"a": [1, 2.5e-3, -0, true, null], "b": "\\u00e9\\ud83d\\ude00\\n"}', "01", '"a\nb"', "NaN",
             '["\\"]"]', "1e400", "-1E+2"]
    results = []
    for load in (False, True):
        records._scan = None
        if load:
            records.load_scanner()
        out = []
        for t in texts:
            try:
                out.append(("ok", records.from_json(t)))
            except ValueError:
                out.append(("refused", None))
        results.append(out)
    assert results[0] == results[1]
    assert [r for r, _ in results[0]] == ["ok", "refused", "refused", "refused", "ok", "refused", "ok"]


def test_records_json_reader_refuses_numbers_out_of_range(json_parser: str) -> None:
    # No state file holds more than 64 bits or an infinity; as a Python int
    # such a number raises OverflowError where a reader mixes it with a float.
    from slotq.records import from_json

    assert from_json('[9223372036854775807, -9223372036854775808, 1e308, -2.5e-320]') == \
        [2**63 - 1, -2**63, 1e308, -2.5e-320]
    for bad in ('{"since": 9223372036854775808}', "-9223372036854775809", "1" + "0" * 400, "1e400", "[-1E309]"):
        with pytest.raises(ValueError, match="number out of range"):
            from_json(bad)


def test_clean_state_gives_a_records_fields_the_types_readers_rely_on() -> None:
    from slotq.records import clean_state

    good = {"run_id": "abc", "label": "l", "cls": "shared", "host": "h", "phase": "running", "pid": 5,
            "pid_start": 0, "keeper": 6, "keeper_start": 7, "cmd": 8, "cmd_start": 9, "uid": 0,
            "since": 1.7e9, "budget": 60, "grace": 2.5, "other": [1]}
    assert clean_state(good) == good
    odd = {"pid": [], "keeper": {}, "cmd": "1", "cmd_start": 1.5, "uid": -1, "pid_start": True,
           "since": -1, "budget": 1e12, "grace": "2", "label": ["x"], "cls": 5, "host": False, "phase": {},
           "run_id": None}
    assert clean_state(odd) == dict.fromkeys(odd)


def test_records_json_turns_non_finite_floats_into_null(json_parser: str) -> None:
    from slotq.records import to_json

    assert to_json({"x": float("nan"), "y": float("inf")}) == '{"x":null,"y":null}'
    assert to_json([1.5, float("-inf"), "é"]) in ('[1.5,null,"é"]', '[1.5,null,"\\u00e9"]')
    with pytest.raises(TypeError, match="cannot encode set"):
        to_json({"x": {1}})


def test_option_parser_handles_forms_and_errors() -> None:
    from slotq.cli.args import APPEND, FLAG, Opt, Parser, duration
    from slotq.errors import UsageError

    p = Parser("t", "t [options] -- CMD", "test", [
        Opt("--budget", metavar="D", convert=duration()),
        Opt("-q", "--quiet", kind=FLAG),
        Opt("--opt", kind=APPEND),
        Opt("--mode", choices=("a", "b"), default="a"),
    ], command="required")
    opts, cmd = p.parse(["--budget=1m", "-q", "--opt", "x", "--opt=y", "--", "ls", "-l"])
    assert (opts.budget, opts.quiet, opts.opt, opts.mode, cmd) == (60.0, True, ["x", "y"], "a", ["ls", "-l"])
    opts, cmd = p.parse(["pytest", "-q"])  # the command starts at the first non-option
    assert cmd == ["pytest", "-q"] and opts.quiet is False
    assert p.parse(["--opt=--", "--", "x"])[0].opt == ["--"]  # `--` as a value: said with `=`
    for bad, needle in ((["--nope", "--", "x"], "unknown option --nope"), (["--budget"], "needs a value"),
                        (["--budget", "--", "x"], r"option --budget needs a value \(D\)"),
                        (["--budget", "x1", "--", "x"], "option --budget: cannot read"),
                        (["--mode", "c", "--", "x"], "'c' is not one of a, b"), ([], "no command given"),
                        (["-q=1", "--", "x"], "takes no value")):
        with pytest.raises(UsageError, match=needle):
            p.parse(bad)


def test_config_is_parsed_once_and_reread_when_it_changes(tmp_path: os.PathLike[str]) -> None:
    import sys

    path = os.path.join(tmp_path, "host.toml")
    with open(path, "w") as f:
        f.write("[pools]\nshared = 2\n")
    assert HostConfig.load(path=path, state_dir=str(tmp_path)).pools["shared"] == 2
    assert os.path.exists(os.path.join(tmp_path, f".host-config.cache.{os.getuid()}"))
    sys.modules.pop("tomllib", None)
    assert HostConfig.load(path=path, state_dir=str(tmp_path)).pools["shared"] == 2
    assert "tomllib" not in sys.modules  # served from the cache
    with open(path, "w") as f:
        f.write("[pools]\nshared = 3\nlanding = 1\n")
    assert HostConfig.load(path=path, state_dir=str(tmp_path)).pools["shared"] == 3


def test_a_quiet_request_stays_quiet_on_the_way_to_a_remote_runner() -> None:
    from slotq.spec import RunSpec

    assert RunSpec.from_request(RunSpec(["true"], quiet=True).to_request()).quiet is True
    assert RunSpec.from_request(RunSpec(["true"]).to_request()).quiet is False
    assert RunSpec.from_request(b'{"argv": ["true"]}\n').quiet is False  # a request that does not say


def test_a_submission_time_travels_only_when_set_so_older_hosts_take_the_request() -> None:
    # A host of an older slotq refuses a field it does not know: a run over
    # ssh (no submission time) must not send one.
    from slotq.spec import RunSpec

    assert b"submitted" not in RunSpec(["true"]).to_request()
    assert RunSpec.from_request(RunSpec(["true"], submitted=1.8e9).to_request()).submitted == 1.8e9
    # So do a late-bound run's other hosts and a kept run's lease.
    plain = RunSpec(["true"]).to_request()
    assert b"bind" not in plain and b"kept" not in plain
    spec = RunSpec(["true"])
    spec.bind, spec.kept = ["ci2", "ci3"], 900.0
    back = RunSpec.from_request(spec.to_request())
    assert (back.bind, back.kept) == (["ci2", "ci3"], 900.0)


def test_a_run_that_names_no_report_period_reports_every_30_s_by_the_cli_and_by_request() -> None:
    from slotq.cli.run import PARSER
    from slotq.spec import RunSpec

    opts, command = PARSER.parse(["--", "true"])
    assert command == ["true"]
    assert opts.report_every == 30.0  # the mission: every 30 s
    assert RunSpec(["true"]).report_every == 30.0  # the Python API
    for request in (b'{"argv": ["true"]}\n', b'{"argv": ["true"], "report_every": null}\n'):
        assert RunSpec.from_request(request).report_every == 30.0  # a request that does not say


@pytest.mark.parametrize("opt, refused", [
    ("--ntasks=2", "--ntasks"), ("--ntask=2", "--ntasks"), ("--ntasks-per-node=2", "--ntasks-per-node"),
    ("-n2", "--ntasks"), ("-n", "--ntasks"), ("-lv", "--label"), ("-vl", "--label"), ("-ofile", "--output"),
    ("--out=f", "--output"), ("--input=none", "--input"), ("-J", "--job-name"), ("--job-name=x", "--job-name"),
    ("-Q", "--quiet"), ("--pty", "--pty"), ("--test-only", "--test-only"),
    # used as they are: the rest of an option with a value is its value
    ("--cpus-per-task=4", None), ("-c4", None), ("-cn", None), ("-v", None), ("--time=5", None),
    ("-t5", None), ("--nodes=1", None), ("--account=ci", None), ("--error=/dev/null", None), ("--", None),
])
def test_srun_options_that_break_a_run_are_named(opt: str, refused: str | None) -> None:
    from slotq.config import srun_option_problem

    why = srun_option_problem(opt)
    assert (why is None) if refused is None else (why is not None and refused in why), why


def test_an_eta_says_what_is_known_a_free_slot_a_bound_from_the_budgets_or_the_typical_run() -> None:
    # A fresh pool said "unknown" for everything, "a new run would wait
    # unknown" with a slot free (it waits 0), in a 230-character line.
    from slotq.history.eta import eta_words, pool_etas

    free = {"slot": "shared#0", "held": False}
    held = {"slot": "shared#0", "held": True, "held_s": 100.0, "budget": 600.0, "label": "suite", "user": "bob"}
    two = [{"slot": "shared#1", "held": True, "held_s": 10.0, "budget": 300.0}]
    few = [{"label": "x", "uid": 99999, "pool": "shared", "ran_s": 10.0}] * 2  # 2 runs: no typical run yet
    pool: dict[str, object] = {"pool": "shared", "slots": [free], "waiting": []}
    new = pool_etas(pool, [])
    assert (new["s"], new["at_most_s"], new["how"]) == (0.0, None, "a slot is free")
    assert eta_words(new["s"], new["at_most_s"]) == "0 (a slot is free)"
    # A slot free with a run ahead: that run takes it; the bound is its budget.
    pool["waiting"] = [{"label": "lint", "user": "carol", "budget": 120.0}]
    new = pool_etas(pool, few)
    assert (new["s"], new["at_most_s"]) == (None, 120.0), new
    assert pool["waiting"][0]["eta"]["s"] == 0.0  # type: ignore[index]
    # Held: the holder's budget left, then each run ahead's whole budget,
    # on the slot that frees first.
    pool.update(slots=[held], waiting=[])
    new = pool_etas(pool, few)
    assert (new["s"], new["at_most_s"]) == (None, 500.0), new
    assert new["how"] == "the holders' budgets left; typical run unknown until 5 runs of this pool, 2 so far"
    assert eta_words(new["s"], new["at_most_s"]) == "at most 8m20s"
    pool.update(slots=[held, *two], waiting=[{"budget": 120.0}, {"budget": 60.0}])
    assert pool_etas(pool, few)["at_most_s"] == 470.0  # shared#1 free by 290 s, +120 s, +60 s; shared#0 by 500 s
    # A run ahead whose budget is not known: no bound.
    pool.update(slots=[held], waiting=[{"label": "?"}])
    new = pool_etas(pool, few)
    assert (new["s"], new["at_most_s"]) == (None, None) and eta_words(None, None) == "unknown"
    assert new["how"] == "typical run unknown until 5 runs of this pool, 2 so far"
    # Five runs: the estimate, as before.
    records = [{"label": "x", "uid": 99999, "pool": "shared", "ran_s": 400.0}] * 5
    pool.update(slots=[held], waiting=[])
    new = pool_etas(pool, records)
    assert (new["s"], new["at_most_s"], new["typical_run_s"]) == (300.0, None, 400.0), new
    assert eta_words(new["s"], None) == "~5m00s more"


def test_an_eta_counts_each_run_as_runs_like_it_and_says_so() -> None:
    # Every run took the pool's typical time: a 5-minute suite holding the
    # slot was expected to free it in seconds because most runs were lints.
    from slotq.history.eta import pool_etas
    from slotq.procinfo import user_name

    me = os.getuid()
    records: list[dict[str, object]] = [{"label": "lint", "uid": 99999, "pool": "shared", "ran_s": 10.0}] * 10
    records += [{"label": "suite", "uid": me, "pool": "shared", "ran_s": 300.0}] * 5
    pool: dict[str, object] = {
        "pool": "shared",
        "slots": [{"slot": "shared#0", "held": True, "held_s": 60.0, "label": "suite", "user": "bob"}],
        "waiting": [{"label": "suite", "user": "bob"}, {"label": "lint", "user": "carol"}]}
    new = pool_etas(pool, records)
    waiting = pool["waiting"]
    assert isinstance(waiting, list)
    assert waiting[0]["eta"]["s"] == 240.0  # the suite holding the slot: 300 s, 60 s of it gone
    assert waiting[1]["eta"]["s"] == 540.0  # ... then the suite ahead
    assert new["s"] == 550.0  # ... then the lint
    how = waiting[1]["eta"]["how"]
    assert "typical run 10.0s (median of the pool's last 15 run(s))" in how, how
    assert "shared#0's holder 5m00s (median of its label's last 5 runs)" in how, how
    assert "1 of the runs ahead by runs like them" in how, how
    # A label with too few runs of its own: its user's, then the pool's.
    pool["slots"] = [{"slot": "shared#0", "held": True, "held_s": 60.0, "label": "new", "user": user_name(me)}]
    pool["waiting"] = []
    assert pool_etas(pool, records)["s"] == 240.0
    pool["slots"] = [{"slot": "shared#0", "held": True, "held_s": 5.0, "label": "new", "user": "nobody-here"}]
    assert pool_etas(pool, records)["s"] == 5.0
