"""Fuzzing config.json files and damaged trace sets (issue 9, point 6), with every plugin.

* config.json: a tiny preset of each family as Hugging Face writes it, with keys
  changed to drawn JSON values, removed, or a drawn ``"stage"`` object; `stage report`
  on it is exit 0, or one line with exit 2 (1 for a model too large to lower).
* damaged sets: a written Chakra set truncated, a bit flipped, a file dropped or
  emptied, a record duplicated, dropped or swapped, two files swapped, comm_groups.json
  or manifest.json edited.  `stage validate` never shows a traceback, and refuses
  (exit 1) every change of a trace file and of every manifest field it checks.  The
  fields nothing can check are counted apart: the manifest's model, plan, memory and
  other descriptive fields (nothing in the files says them), and groups no node names.

Grown in issue 26:

* damage also deletes manifest.json (a set STAGE wrote needs it: refused by default) and
  reorders a group's members (the ring order is part of the cost: refused);
* random plans (models of every family, tasks, degrees, schedules, timed or not) through
  `stage generate` and `stage validate`, and, where ``ASTRA_SIM_BIN`` is set, through the
  real simulator: validate's verdict (finishes, never finishes, aborts at the first tick)
  must be what the simulator does, on every plan;
* the plugin commands' inputs: sweep specs (TOML), search flags, calibrate profiles,
  `stage astrasim --timeline` paths: never a traceback, one line, nothing foreign replaced.

The CI profile runs a fixed budget of derandomized examples; ``HYPOTHESIS_PROFILE=long``
runs ten times more at random.  Counts per category are printed after the run.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stage_adapter_chakra import wire

from stage_core.cli import main

COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
              database=None)
settings.register_profile("ci", max_examples=40, derandomize=True, **COMMON)
settings.register_profile("long", max_examples=400, **COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
STATS: Counter = Counter()


def budget(factor: int = 1):
    profile = settings.get_profile(PROFILE)
    return settings(profile, max_examples=profile.max_examples * factor)


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    yield
    line = f"fuzz ({PROFILE} profile): " + ", ".join(f"{k}: {v}" for k, v in sorted(STATS.items()))
    request.config.fuzz_counts = [*getattr(request.config, "fuzz_counts", []), line]


def run(host, capsys, *argv):
    status = main(list(map(str, argv)), host=host)  # an exception fails the test: a traceback
    return status, capsys.readouterr().err


# --------------------------------------------------------------------------- config.json

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 12),
              st.sampled_from([0, 64, 2**31, 2**63, 10**30, -(2**63)]),
              st.sampled_from([0.5, -1.5, 1e30, math.inf, -math.inf, math.nan, 4096.0]),
              st.text(max_size=6), st.sampled_from(["bfloat16", "silu", "gelu", "flash", "fp32", "llama"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)
STAGE_KEYS = ["name", "vocab_pad_to", "seq_len", "attention", "causal_flops", "dtype", "capacity_factor", "bogus"]
TINY = ["gpt-tiny", "llama-tiny", "moe-tiny", "moe-mla-tiny", "gemma-tiny", "mamba2-tiny", "hybrid-tiny"]


@st.composite
def config_jsons(draw, host):
    name = draw(st.sampled_from(TINY))
    spec = next(s for s in host.models() if name in s.presets)
    data = spec.presets[name].to_hf()
    keys = sorted(data)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "set", "delete", "stage", "model_type"]))
        if action == "set":
            data[draw(st.sampled_from(keys))] = draw(JSON_VALUES)
        elif action == "delete" and data:
            data.pop(draw(st.sampled_from(sorted(data))), None)
        elif action == "stage":
            data["stage"] = draw(st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(STAGE_KEYS), JSON_VALUES,
                                                                        max_size=3)))
        else:
            data["model_type"] = draw(st.sampled_from(["gpt2", "llama", "mixtral", "deepseek_v3", "gemma2",
                                                       "mamba2", "nemotron_h", "bert", ""]))
    return name, data


@pytest.mark.parametrize("shape", ["object"])
def test_any_config_json(shape, host, tmp_path_factory, capsys):
    @budget()
    @given(drawn=config_jsons(host))
    def check(drawn):
        name, data = drawn
        path = tmp_path_factory.mktemp("config") / "config.json"
        path.write_text(json.dumps(data))  # (inf and nan as JSON's Infinity and NaN)
        status, err = run(host, capsys, "report", "--model", path, "--json")
        assert "Traceback" not in err
        if status:
            lines = err.strip().splitlines()
            assert status in (1, 2) and len(lines) == 1 and lines[0].startswith("stage: error: "), err
        STATS[f"config.json exit {status}"] += 1

    check()


# --------------------------------------------------------------------------- damaged sets

PLANS = {
    "gpt-tiny pp2 dp2": ["--model", "gpt-tiny", "--pp", "2", "--dp", "2", "--micro-batches", "2"],
    "llama-tiny tp2 timed": ["--model", "llama-tiny", "--tp", "2", "--gpu", "h100"],
    "moe-tiny ep2": ["--model", "moe-tiny", "--ep", "2", "--dp", "2"],
}
#: manifest fields validate compares with the files (a path's parts, * for any index)
CHECKED = ("world_size", "rank_classes", "rank_classes.*", "rank_classes.*.ranks", "rank_classes.*.ranks.*",
           "rank_classes.*.flops", "rank_classes.*.flops.matmul", "rank_classes.*.flops.other",
           "rank_classes.*.flops.total", "rank_classes.*.comm_bytes", "rank_classes.*.comm_bytes.*",
           "rank_classes.*.nodes", "rank_classes.*.kernel_bytes", "rank_classes.*.program_sha256",
           "rank_classes.*.compute_time_us", "rank_classes.*.wire_bytes", "rank_classes.*.wire_bytes.*")


@pytest.fixture(scope="module")
def sets(host, tmp_path_factory):
    out = {}
    for label, argv in PLANS.items():
        folder = tmp_path_factory.mktemp("fuzz-set") / "set"
        assert main(["generate", *argv, "-o", str(folder)], host=host) == 0
        out[label] = folder
    return out


def records(data: bytes) -> list[tuple[int, int]]:
    _, starts = wire.split_frames(data)
    return list(zip(starts, starts[1:]))


def leaves(doc, path=()):
    """(path, value) of every value in a JSON document, containers included."""
    yield path, doc
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from leaves(value, (*path, key))


def pattern(path) -> str:
    return ".".join("*" if isinstance(p, int) else str(p) for p in path)


def checked(path) -> bool:
    """Whether validate compares the manifest field at ``path`` with the files."""
    parts = pattern(path).split(".")
    return any(len(parts) == len(c) and all(b in ("*", a) for a, b in zip(parts, c))
               for c in (c.split(".") for c in CHECKED))


def used_groups(folder: Path) -> set[str]:
    from stage_adapter_chakra.etread import read

    return {n.attr("pg_name") for _, nodes in read(folder).iter_ranks() for n in nodes if n.attr("pg_name")}


KINDS = ["truncate", "flip", "flip", "drop file", "empty file", "duplicate record", "drop record",
         "swap records", "swap files", "edit comm_groups.json", "edit manifest.json", "edit manifest.json",
         "delete manifest.json", "reorder a group"]


def damage(draw, folder: Path, used: set[str]) -> tuple[str, bool]:
    """Damage the set in ``folder``; (category, whether validate must refuse it)."""
    kind = draw(st.sampled_from(KINDS))
    files = sorted(folder.glob("trace.*.et"), key=lambda p: int(p.name.split(".")[1]))
    path = draw(st.sampled_from(files))
    data = path.read_bytes()
    bounds = records(data)
    if kind == "truncate":
        path.write_bytes(data[:draw(st.integers(0, len(data) - 1))])
    elif kind == "flip":
        cut = bytearray(data)
        cut[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        path.write_bytes(bytes(cut))
    elif kind == "drop file":
        path.unlink()
    elif kind == "empty file":
        path.write_bytes(b"")
    elif kind in ("duplicate record", "drop record", "swap records"):
        i = draw(st.integers(1, len(bounds) - 2))
        (a, b), (c, d) = bounds[i], bounds[i + 1]
        if kind == "duplicate record":
            path.write_bytes(data[:b] + data[a:b] + data[b:])
        elif kind == "drop record":
            path.write_bytes(data[:a] + data[b:])
        else:
            if data[a:b] == data[c:d]:
                return kind + " (identical)", False
            path.write_bytes(data[:a] + data[c:d] + data[a:b] + data[d:])
    elif kind == "delete manifest.json":  # its traces say STAGE wrote it: refused by default
        (folder / "manifest.json").unlink()
    elif kind == "reorder a group":
        groups = json.loads((folder / "comm_groups.json").read_text())
        name = draw(st.sampled_from(sorted(groups)))
        order = draw(st.permutations(groups[name]))
        if list(order) == list(groups[name]):
            return kind + " (same order)", False
        groups[name] = list(order)
        (folder / "comm_groups.json").write_text(json.dumps(groups))
    elif kind == "swap files":
        other = draw(st.sampled_from(files))
        if other.read_bytes() == data:
            return kind + " (identical)", False
        path.write_bytes(other.read_bytes())
        other.write_bytes(data)
    else:
        name = "comm_groups.json" if "comm_groups" in kind else "manifest.json"
        doc = json.loads((folder / name).read_text())
        where, old = draw(st.sampled_from([(p, v) for p, v in leaves(doc) if p]))
        value = draw(st.one_of(JSON_VALUES, st.just(old + 1) if type(old) is int else st.nothing()))
        parent = doc
        for part in where[:-1]:
            parent = parent[part]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[where[-1]]
            value = "(removed)"
        else:
            parent[where[-1]] = value
        if value == old and type(value) is type(old):
            return kind + " (same value)", False
        (folder / name).write_text(json.dumps(doc))
        if name == "manifest.json":
            optional = {"rank_classes.*.program_sha256": "as --no-validate writes",
                        "rank_classes.*.nodes": "as an older STAGE wrote", "rank_classes.*.kernel_bytes": "likewise",
                        "rank_classes.*.wire_bytes": "likewise"}
            if value == "(removed)" and pattern(where) in optional:
                return kind + f" (unchecked: {pattern(where)} removed, {optional[pattern(where)]})", False
            return kind + ("" if checked(where) else f" (unchecked: {pattern(where)})"), checked(where)
        return kind + ("" if where[0] in used else " (a group no node names)"), where[0] in used
    return kind, True


@pytest.mark.parametrize("label", list(PLANS))
def test_any_damage_to_a_set(label, sets, host, tmp_path_factory, capsys):
    used = used_groups(sets[label])

    @budget()
    @given(data=st.data())
    def check(data):
        folder = tmp_path_factory.mktemp("damaged") / "set"
        shutil.copytree(sets[label], folder)
        category, must_refuse = damage(data.draw, folder, used)
        status, err = run(host, capsys, "validate", folder)
        assert "Traceback" not in err
        lines = err.strip().splitlines()
        assert all(line.startswith(("stage: ", f"{folder}: ")) for line in lines), err
        if status == 0:
            assert not must_refuse, f"{category}: passed validate"
        else:
            assert status == 1 and lines, (status, err)
            assert not lines[0].startswith("stage: error") or len(lines) == 1, err  # a read error: one line
        STATS[f"{category}: {'refused' if status else 'passed'}"] += 1
        shutil.rmtree(folder.parent, ignore_errors=True)

    check()


# --------------------------------------------------------------------------- random plans: validate vs the simulator

ASTRA_SIM = os.environ.get("ASTRA_SIM_BIN")
FINISHED = re.compile(r"sys\[(\d+)\] finished")


@st.composite
def plans(draw):
    model = draw(st.sampled_from(["gpt-tiny", "llama-tiny", "moe-tiny", "gemma-tiny", "mamba2-tiny", "hybrid-tiny"]))
    task = draw(st.sampled_from(["train", "train", "prefill", "decode"]))
    argv = ["--model", model, "--task", task]
    for flag, values in (("--tp", [1, 2]), ("--pp", [1, 2]), ("--dp", [1, 2, 4]), ("--micro-batches", [1, 2, 4]),
                         ("--micro-batch-size", [1, 2])):
        argv += [flag, str(draw(st.sampled_from(values)))]
    if "moe" in model or "hybrid" in model:
        argv += ["--ep", str(draw(st.sampled_from([1, 2])))]
    if draw(st.booleans()):
        argv += ["--schedule", draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))]
        if "interleaved" in argv:
            argv += ["--virtual-stages", "2"]
    if task == "train":
        argv += ["--zero", str(draw(st.sampled_from([0, 1, 3]))),
                 "--recompute", draw(st.sampled_from(["none", "selective", "full"]))]
        argv += ["--seq-len", str(draw(st.sampled_from([64, 128])))]
    elif task == "prefill":
        argv += ["--seq-len", str(draw(st.sampled_from([16, 64])))]
    else:
        argv += ["--context-len", str(draw(st.sampled_from([16, 64])))]
    if draw(st.booleans()):
        argv.append("--sp")
    if draw(st.booleans()):
        argv += ["--gpu", draw(st.sampled_from(["h100", "a100"]))]
    return argv


def _simulate_by_hand(folder: Path, tmp: Path) -> tuple[int, int]:
    """(exit status, ranks that printed "finished") of the real simulator on ``folder``, with
    the configs `stage astrasim` writes (h100, or the hardware the set was timed for)."""
    from stage_adapter_astrasim.command import run_astrasim

    import io

    run_astrasim(folder, astra_sim=None, env={}, out=io.StringIO(), err=io.StringIO(), validate=False,
                 breakdown=False)
    cfg = folder / "astrasim"
    ran = subprocess.run([ASTRA_SIM, f"--workload-configuration={folder}/trace",
                          f"--comm-group-configuration={folder}/comm_groups.json",
                          f"--system-configuration={cfg}/system.json", f"--network-configuration={cfg}/network.yml",
                          f"--remote-memory-configuration={cfg}/memory.json"],
                         capture_output=True, text=True, cwd=tmp, timeout=600)
    return ran.returncode, len(set(FINISHED.findall(ran.stdout)))


def test_random_plans_validate_as_the_simulator_runs_them(host, tmp_path_factory, capsys):
    @budget(3)
    @given(argv=plans())
    def check(argv):
        tmp = tmp_path_factory.mktemp("plan")
        folder = tmp / "set"
        status, err = run(host, capsys, "generate", *argv, "-q", "-o", folder)
        assert "Traceback" not in err
        if status:
            assert status in (1, 2) and err.strip().count("\n") == 0, err
            STATS[f"random plans: refused by generate (exit {status})"] += 1
            return
        world = json.loads((folder / "manifest.json").read_text())["world_size"]
        status, err = run(host, capsys, "validate", folder)
        assert "Traceback" not in err and status in (0, 1), err
        said = "finishes" if status == 0 else "aborts at the first tick" if "first tick" in err else "never finishes"
        assert said != "never finishes", err  # (a STAGE set always finishes: the chain of docs/design.md)
        if not ASTRA_SIM or world < 2:  # (the analytical network needs two NPUs)
            STATS[f"random plans: validate says {said} ({'one rank' if ASTRA_SIM else 'no simulator'})"] += 1
            return
        code, finished = _simulate_by_hand(folder, tmp)
        did = "finishes" if code == 0 and finished == world else \
            "aborts at the first tick" if code == -6 and finished == 0 else f"status {code}, {finished}/{world}"
        assert did == said, (argv, err, did)
        STATS[f"random plans: validate and simulator agree, {said}"] += 1
        shutil.rmtree(tmp, ignore_errors=True)

    check()


# --------------------------------------------------------------------------- the plugin commands' inputs


def one_line_or_ok(status, err, progress=False):
    """Exit 0, or 1 or 2 with one line (``progress``: after the lines a command prints on
    stderr as it works, such as stage search's)."""
    assert "Traceback" not in err, err
    if status:
        lines = err.strip().splitlines()
        ours = [line for line in lines if line.startswith("stage: ")]
        assert status in (1, 2) and ours == lines[-1:] and (progress or len(lines) == 1), err


def garden_snapshot(folder: Path) -> dict:
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out[rel] = ("link", os.readlink(path)) if path.is_symlink() else \
            path.read_bytes() if path.is_file() else path.is_dir()
    return out


def users_garden(folder: Path) -> None:
    (folder / "mine.csv").write_text("run,loss\n1,0.3\n")
    (folder / "mine.json").write_text('{"my": "numbers"}')
    os.mkfifo(folder / "fifo.csv")
    (folder / "link.json").symlink_to(folder / "mine.json")


SPEC_KEYS = ["model", "tp", "dp", "pp", "seq-len", "micro-batches", "zero", "sp", "system", "task", "set",
             "schedule"] * 3 + ["bogus", "gpu"]
SPEC_VALUES = st.one_of(st.sampled_from(["gpt-tiny", "llama-tiny", "h100", "a100", "nope", "", "train", "decode",
                                         "1f1b", "layers=3", "=", True, False, 0, 1, 2, 4, -1, 10**12, 1.5,
                                         float("nan")]),
                        st.integers(-3, 8))


@st.composite
def sweep_specs(draw):
    lines = []
    measure = draw(st.sampled_from([None, None, "report", "report", "estimate", "nope", 3]))
    if measure is not None:
        lines.append(f"measure = {json.dumps(measure)}")
    base = draw(st.dictionaries(st.sampled_from(SPEC_KEYS), SPEC_VALUES, max_size=3))
    base.setdefault("model", "gpt-tiny")
    lines.append("[base]")
    lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in base.items()]
    lines.append("[grid]")
    if draw(st.integers(0, 9)) == 0:  # a grid far too large to expand
        lines += [f'"{k}" = {list(range(1, 101))}' for k in ("dp", "tp", "pp", "seq-len", "micro-batches")]
    else:
        grid = draw(st.dictionaries(st.sampled_from(SPEC_KEYS), st.lists(SPEC_VALUES, max_size=2), max_size=2))
        lines += [f"{json.dumps(k)} = [{', '.join(map(_toml, v))}]" for k, v in grid.items()]
    if draw(st.integers(0, 19)) == 0:
        lines.append(draw(st.sampled_from(["[grid", "x = ", "[[grid]]\ntp = [1]", "bogus = 1", "\xff"])))
    return "\n".join(lines) + "\n"


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v != v:
        return "nan"
    return json.dumps(v)


def test_any_sweep_spec(host, tmp_path_factory, capsys):
    @budget()
    @given(text=sweep_specs(), out=st.sampled_from(["t.csv", "t.json", "t.csv", "t.json", "sub/t.csv", "t.xlsx",
                                                    "mine.csv", "mine.json", "fifo.csv", "link.json", "spec.toml",
                                                    "mine.csv/t.csv"]))
    def check(text, out):
        root = tmp_path_factory.mktemp("sweep")
        users_garden(root)
        (root / "spec.toml").write_text(text)
        before = garden_snapshot(root)
        status, err = run(host, capsys, "sweep", root / "spec.toml", "-o", root / out, "--workers", "1",
                          "--cache", root / ".cache")
        one_line_or_ok(status, err)
        after = {k: v for k, v in garden_snapshot(root).items() if not k.startswith(".cache")}
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        assert changed <= ({out, "sub"} if status == 0 else set()), changed  # no foreign path replaced
        assert not (out in before and status == 0), out  # every file there is the user's: no --force, no write
        STATS[f"sweep specs: exit {status}"] += 1
        shutil.rmtree(root, ignore_errors=True)

    check()


SEARCH_FLAGS = ["--gpus", "--gpu-memory", "--global-batch", "--seq-len", "--tp", "--pp", "--max-pp",
                "--micro-batch-size", "--top", "--candidates", "--zero", "--task", "--gpu"]
SEARCH_VALUES = st.one_of(st.sampled_from(["0", "-1", "1", "2", "8", "nan", "inf", "-inf", "1e9", "1000000007",
                                           "", "x", "decode", "train", "h100", "a100", "nope"]),
                          st.integers(-2, 64).map(str))


def test_any_search_flags(host, tmp_path_factory, capsys):
    profile = settings.get_profile(PROFILE)

    @settings(profile, max_examples=max(10, profile.max_examples // 2))  # (a search that runs takes seconds)
    @given(flags=st.lists(st.sampled_from(SEARCH_FLAGS), max_size=3, unique=True), data=st.data())
    def check(flags, data):
        argv = ["search", "--model", "gpt-tiny", "--no-simulate", "--tp", "1", "--micro-batch-size", "1",
                "--zero", "0", "--recompute", "none", "--top", "1", "--candidates", "1", "--gpus", "8"]
        for flag in flags:
            argv += [flag, data.draw(SEARCH_VALUES)]
        status, err = run(host, capsys, *argv)
        one_line_or_ok(status, err, progress=True)
        STATS[f"search flags: exit {status}"] += 1

    check()


KINETO_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                          st.text(max_size=4), st.lists(st.integers(-2, 4096), max_size=3),
                          st.lists(st.lists(st.integers(-2, 4096), max_size=3), max_size=3))
BF16 = "c10::BFloat16"


def _operator(ext, name, dims, micros):
    """An operator and its kernel, as torch.profiler writes them."""
    return [{"ph": "X", "cat": "cpu_op", "name": name, "args": {"External id": ext, "Input Dims": dims,
                                                                "Input type": [BF16] * len(dims)}},
            {"ph": "X", "cat": "kernel", "name": "k_" + name, "dur": micros, "args": {"External id": ext}}]


def _plausible_profile() -> list[dict]:
    """GEMMs and elementwise kernels timed by the a100 preset's own calibrated model: what a
    fit on --gpu a100 takes (and gives back)."""
    from stage_hardware import kineto
    from stage_hardware.compute import calibrated_time
    from stage_hardware.presets import PRESETS

    gpu = next(p for p in PRESETS if p.name == "a100").gpu
    events, ext = [], 0
    shapes = [("aten::mm", [[m, k], [k, n]]) for m, k, n in ((512, 1024, 4096), (2048, 4096, 1024),
                                                            (8192, 8192, 8192), (1024, 256, 2048), (4096, 64, 4096))]
    shapes += [("aten::gelu", [[size]]) for size in (1 << 16, 1 << 20, 1 << 24)]
    for name, dims in shapes:
        ext += 1
        kernel = kineto._operator_kernel(name, {"Input Dims": dims, "Input type": [BF16] * len(dims)})
        events += _operator(ext, name, dims, calibrated_time(kernel, gpu) * 1e6)
    return events


@st.composite
def kineto_events(draw):
    events = _plausible_profile() if draw(st.sampled_from([True, True, True, False])) else []
    for _ in range(draw(st.integers(0, 3))):  # damage: a field changed, an event added or dropped
        action = draw(st.sampled_from(["field", "field", "args", "drop", "add"]))
        if action == "add" or not events:
            events.append({"ph": draw(st.sampled_from(["X", "B", 1])), "cat": draw(st.sampled_from(
                ["kernel", "cpu_op", "cuda_runtime", "Kernel"])), "name": draw(st.sampled_from(
                    ["aten::mm", "aten::_flash_attention_forward", "nccl_x", ""])),
                "dur": draw(KINETO_VALUES), "args": draw(st.one_of(KINETO_VALUES, st.dictionaries(
                    st.sampled_from(["External id", "correlation", "Input Dims", "Input type"]), KINETO_VALUES,
                    max_size=3)))})
            continue
        i = draw(st.integers(0, len(events) - 1))
        if action == "drop":
            events.pop(i)
        elif action == "args" and isinstance(events[i].get("args"), dict):
            events[i]["args"][draw(st.sampled_from(["External id", "Input Dims", "Input type", "correlation"]))] = \
                draw(KINETO_VALUES)
        else:
            events[i][draw(st.sampled_from(["dur", "ph", "cat", "name", "args"]))] = draw(KINETO_VALUES)
    return events


def test_any_calibrate_profile(host, tmp_path_factory, capsys):
    @budget()
    @given(events=kineto_events(), wrap=st.sampled_from(["object", "list", "gzip", "garbage"]))
    def check(events, wrap):
        root = tmp_path_factory.mktemp("calibrate")
        doc = json.dumps({"traceEvents": events} if wrap != "list" else events)
        data = {"gzip": lambda t: __import__("gzip").compress(t.encode()), "garbage": lambda t: b"\x1f\x8b" + b"x" * 9
                }.get(wrap, str.encode)(doc)
        (root / "p.json").write_bytes(data)
        status, err = run(host, capsys, "calibrate", root / "p.json", "--gpu", "a100", "-o", root / "o.json")
        one_line_or_ok(status, err)
        if status == 0:  # what --gpu FILE then reads: within physical bounds, no crash
            assert run(host, capsys, "report", "--model", "gpt-tiny", "--gpu", root / "o.json")[0] == 0
        else:
            assert not (root / "o.json").exists()
        assert (root / "p.json").read_bytes() == data
        STATS[f"calibrate profiles: exit {status}"] += 1
        shutil.rmtree(root, ignore_errors=True)

    check()


def test_any_timeline_path(host, sets, tmp_path_factory, capsys):
    @budget()
    @given(name=st.sampled_from(["t.json", "mine.json", "fifo.csv", "link.json", "set/trace.0.et", "set/new.json",
                                 "set/astrasim/t.json", "/dev/null", "", "sub/t.json", "mine.json/t.json",
                                 "t.png", "spec.toml"]),
           force=st.booleans(), plot=st.booleans())
    def check(name, force, plot):
        root = tmp_path_factory.mktemp("timeline")
        users_garden(root)
        shutil.copytree(sets["gpt-tiny pp2 dp2"], root / "set")
        before = garden_snapshot(root)
        flag = "--plot" if plot and name.endswith(".png") else "--timeline"
        argv = ["astrasim", root / "set", flag, name if name.startswith("/") or not name else root / name]
        if ASTRA_SIM:
            argv += ["--astra-sim", ASTRA_SIM]
        status, err = run(host, capsys, *argv, *(["--force"] if force else []))
        one_line_or_ok(status, err)
        after = garden_snapshot(root)
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)
                   and not k.startswith("set/astrasim")}
        allowed = {name, "sub"} if status == 0 and not name.startswith("set") else set()
        if not force:
            allowed -= {"mine.json"}
        assert changed <= allowed, (changed, err)  # nothing foreign replaced, a set's file never
        STATS[f"timeline paths: {'written' if changed else 'refused' if status else 'unchanged'}"] += 1
        shutil.rmtree(root, ignore_errors=True)

    check()
