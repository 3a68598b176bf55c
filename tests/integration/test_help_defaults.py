"""Help that matches behaviour (issue 25): every default a command's --help names as a
value ("(default 1)", "(default: gpt-tiny; ...)", "else h100") is run, and the command
given that value must do exactly what it does without the flag.

Each command runs twice in this process (the installed plugins, the real host): once
without the flag, once with ``--flag VALUE``; its result (the JSON it prints, or the
files it writes) must be the same.  A default that is not a value ("the model's", "every
core") is listed and left out; the test fails if a flag a user meets every day is among
those left out, or if a documented value is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stage_core.cli import build_parser, main

#: "(default X", "; default X", ", default: X" ... up to the end of the clause
_DEFAULT = re.compile(r"(?:\(|; |, )default:? (?P<text>[^;)]*)")
#: a default given after a condition: "the --plan's GPU, else h100"
_ELSE = re.compile(r"\belse (?P<value>[^\s,;)]+)")
#: words that start a default which is not a value (what the flag falls back to)
_NOT_A_VALUE = {"the", "every", "one", "an", "a", "its", "max(10,", "untimed", "$astra_sim_bin,", "for", "from"}


def documented_default(help_text: str) -> str | None:
    """The value a flag's help names as its default, or None when it names none."""
    text = " ".join((help_text or "").split())
    m = _DEFAULT.search(text)
    if m is None:
        return None
    clause = m["text"]
    alt = _ELSE.search(clause)
    first = alt["value"] if alt is not None else clause.split()[0].rstrip(":,") if clause.split() else ""
    # (not a value: a word of what it falls back to, or another flag's metavar: "else N")
    return None if not first or first.lower() in _NOT_A_VALUE or (first.isupper() and len(first) <= 2) else first


def flags_with_defaults(parser) -> list[tuple[str, str, object]]:
    """(flag, documented value, action) of each option of ``parser``."""
    out = []
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.help in (None, "==SUPPRESS==") or action.nargs == 0:
            continue
        value = documented_default(action.help)
        if value is not None:
            out.append((longs[0], value, action))
    return out


def subparser(host, name):
    parser = build_parser(host)
    return parser._subparsers._group_actions[0].choices[name]


def _strip(data):
    """A command's JSON without what differs from run to run (its own timings) or says where
    a value came from (``gpu_memory_from``: "default" or "--gpu-memory", the same bytes)."""
    if isinstance(data, dict):
        return {k: _strip(v) for k, v in data.items() if k not in ("seconds", "gpu_memory_from")}
    if isinstance(data, list):
        return [_strip(v) for v in data]
    return data


def json_of(host, capsys, argv):
    status = main(list(argv), host=host)
    out = capsys.readouterr()
    assert status == 0, (argv, out.err)
    return _strip(json.loads(out.out))


def value_for(flag, value, action):
    """The value as the flag takes it (a number's thousands separators dropped)."""
    if action.type in (int, float):
        value = value.replace(",", "")
        try:
            action.type(value)
        except ValueError:
            return None  # (a default named in words: "tp")
    return value


#: per command: the argv its flags are added to, and what is compared
COMMANDS = {
    "report": ["report", "--model", "gpt-tiny", "--json"],
    "estimate": ["estimate", "--model", "gpt-tiny", "--dp", "2", "--json", "--quiet"],
    "search": ["search", "--model", "gpt-tiny", "--gpus", "8", "--seq-len", "256", "--no-simulate",
               "--top", "2", "--candidates", "2", "--json", "--quiet"],
}
#: flags a user meets every day: their documented default must be checked, not left out
MUST_CHECK = {
    "report": {"--dp", "--tp", "--pp", "--cp", "--ep", "--zero", "--recompute", "--schedule", "--virtual-stages",
               "--grad-dtype", "--optimizer-dtype", "--task", "--micro-batch-size", "--micro-batches", "--order",
               "--cp-comm", "--moe-dispatcher", "--max-nodes", "--gpu-memory"},
    "estimate": {"--gpu", "--tp", "--schedule"},
    "search": {"--gpu", "--simulator", "--simulate-max-nodes"},
}
#: flags whose default only matters with another flag (shown with it)
WITH = {"--decode-steps": ["--task", "decode"], "--context-len": ["--task", "decode"],
        "--gpu-memory": ["--task", "decode"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_documented_default_is_the_behaviour(host, capsys, command):
    base = COMMANDS[command]
    checked, left_out = set(), []
    for flag, value, action in flags_with_defaults(subparser(host, command)):
        if flag in base:
            continue
        given = value_for(flag, value, action)
        if given is None:
            left_out.append((flag, value))
            continue
        extra = WITH.get(flag, [])
        without = json_of(host, capsys, [*base, *extra])
        with_it = json_of(host, capsys, [*base, *extra, flag, given])
        assert with_it == without, f"{command} {flag} {given}: --help names it the default, but it changes the result"
        checked.add(flag)
    missing = MUST_CHECK[command] - checked
    assert not missing, f"{command}: no checked default for {sorted(missing)} (left out: {left_out})"


def test_the_default_model_and_the_default_job(host, capsys):
    # --model's default is gpt-tiny once a degree is given ...
    assert json_of(host, capsys, ["report", "--dp", "2", "--json"]) == \
        json_of(host, capsys, ["report", "--model", "gpt-tiny", "--dp", "2", "--json"])
    # ... and with nothing given, the default job its help names: gpt-tiny on dp 8
    help_text = " ".join(subparser(host, "report")._option_string_actions["--model"].help.split())
    assert "the default job: gpt-tiny on dp 8" in help_text
    assert json_of(host, capsys, ["report", "--json"]) == \
        json_of(host, capsys, ["report", "--model", "gpt-tiny", "--dp", "8", "--json"])


def test_generate_writes_where_and_how_its_help_says(host, capsys, tmp_path, monkeypatch):
    parser = subparser(host, "generate")
    defaults = {flag: value for flag, value, _ in flags_with_defaults(parser)}
    assert defaults["--output"] == "./traces" and defaults["--format"] == "chakra"
    monkeypatch.chdir(tmp_path)
    argv = ["generate", "--model", "gpt-tiny", "--dp", "2", "--quiet"]
    assert main(argv, host=host) == 0
    first = json.loads(Path("traces/manifest.json").read_text())
    names = sorted(p.name for p in Path("traces").iterdir())
    assert main([*argv, "--output", "./traces", "--format", "chakra"], host=host) == 0
    capsys.readouterr()
    assert json.loads(Path("traces/manifest.json").read_text()) == first
    assert sorted(p.name for p in Path("traces").iterdir()) == names == [
        "comm_groups.json", "manifest.json", "trace.0.et", "trace.1.et"]


def test_sweep_writes_where_its_help_says(host, capsys, tmp_path, monkeypatch):
    defaults = {flag: value for flag, value, _ in flags_with_defaults(subparser(host, "sweep"))}
    assert defaults == {"--output": "sweep.csv", "--executor": "local", "--cache": "./.stage-sweep"}
    monkeypatch.chdir(tmp_path)
    Path("grid.toml").write_text('[base]\nmodel = "gpt-tiny"\n[grid]\ndp = [1, 2]\n')
    assert main(["sweep", "grid.toml", "--quiet"], host=host) == 0
    table = Path("sweep.csv").read_text()
    cached = sorted(p.name for p in Path(".stage-sweep").iterdir())
    assert main(["sweep", "grid.toml", "--quiet", "--output", "sweep.csv", "--executor", "local", "--cache",
                 "./.stage-sweep"], host=host) == 0
    capsys.readouterr()
    assert Path("sweep.csv").read_text() == table and len(cached) == 2
    assert sorted(p.name for p in Path(".stage-sweep").iterdir()) == cached
    assert table.splitlines()[0].endswith(",comm_bytes_per_gpu,wire_bytes_per_gpu,error")


@pytest.mark.parametrize("text,value", [
    ("data parallel degree (default 1; 8 in the default job)", "1"),
    ("micro-batches per step (gradient accumulation; default 1)", "1"),
    ("seconds to minutes (default 1,000,000: seconds)", "1,000,000"),
    ("time every kernel (default: the --plan's GPU, else h100)", "h100"),
    ("time every kernel (default: the --plan's GPU, else untimed)", None),
    ("tokens per sequence (default: the model's)", None),
    ("processes (default: one per core)", None),
    ("sequences per step (default: a published plan's for this model and GPU count, else N)", None),
    ("a preset name or a config.json (default: gpt-tiny; with no --model ...)", "gpt-tiny"),
])
def test_what_counts_as_a_documented_default(text, value):
    assert documented_default(text) == value
