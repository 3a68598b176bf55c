"""Named plans (the stage_plans hook): `stage plans` lists them, --plan NAME applies them, and
flags given alongside override them."""

import json

import pytest

from stage_core import hookimpl
from stage_core.cli import main
from stage_core.parallel import R
from stage_core.records import PlanSpec, StrategySpec
from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin


def _dp(sg, mesh, plan):
    sg.shard_inputs("dp", "b")
    sg.grad_target["dp"] = R
    return sg


class Plans:
    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("dp", "dp", lambda g, p: [], _dp)]

    @hookimpl
    def stage_plans(self):
        return [PlanSpec("toy-dp4", {"model": "toy", "dp": 4, "global-batch": 16, "seq-len": 16,
                                     "set": ["layers=3"]},
                         description="the toy on four replicas", source="a test")]


class BadPlan:
    @hookimpl
    def stage_plans(self):
        return [PlanSpec("broken", {"model": "toy", "dp": "four"})]


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (Plans(), "plans"))


def report(host, capsys, *argv):
    status = main(["report", *argv, "--json"], host=host)
    out = capsys.readouterr()
    assert status == 0, out.err
    return json.loads(out.out)


def test_stage_plans_lists_name_gpus_and_flags(host, capsys):
    assert main(["plans"], host=host) == 0
    text = capsys.readouterr().out
    assert "toy-dp4" in text and "--dp 4 --global-batch 16" in text and "the toy on four replicas [a test]" in text
    assert main(["plans", "--json"], host=host) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "toy-dp4" and row["world_size"] == 4 and row["plugin"] == "plans"
    assert row["flags"] == ["--model", "toy", "--dp", "4", "--global-batch", "16", "--seq-len", "16",
                            "--set", "layers=3"]


def test_plan_applies_its_model_degrees_batch_and_model_settings(host, capsys):
    m = report(host, capsys, "--plan", "toy-dp4")
    assert m["world_size"] == 4 and m["plan"]["dp"] == 4
    assert m["plan"]["micro_batches"] == 16 // 4 and m["plan"]["seq_len"] == 16
    assert m["model"]["name"] == "toy" and m["model"]["layers"] == 3


def test_flags_given_alongside_override_the_plan(host, capsys):
    m = report(host, capsys, "--plan", "toy-dp4", "--dp", "2", "--set", "layers=5")
    # dp replaced; the plan's global batch of 16 sequences kept: 8 micro-batches per replica
    assert m["plan"]["dp"] == 2 and m["plan"]["micro_batches"] == 8
    assert m["model"]["layers"] == 5 and m["plan"]["seq_len"] == 16
    m = report(host, capsys, "--plan", "toy-dp4", "--micro-batches", "3")  # a batch given replaces the plan's
    assert m["plan"]["micro_batches"] == 3 and m["plan"]["global_batch"] == 12


def test_unknown_plan_is_one_line_listing_the_known(host, capsys):
    assert main(["report", "--plan", "nope"], host=host) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plan nope: unknown plan; known: toy-dp4" in err[0]


def test_a_plan_with_a_bad_setting_names_the_plan_and_its_plugin(capsys):
    host = fresh_host((toy_plugin, "toy"), (BadPlan(), "badplan"))
    assert main(["report", "--plan", "broken"], host=host) == 1
    err = capsys.readouterr().err
    assert "plugin 'badplan': plan 'broken': has a bad setting" in err and "--dp" in err


def test_report_shows_each_rank_class_memory_beside_the_gpu(capsys):
    from dataclasses import replace

    from conftest import tiny_gpu

    hardware = tiny_gpu(2**-10)  # a 1 MiB GPU
    hw, gpu = hardware.hw, hardware.hw.gpu

    host = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (Plans(), "plans"), (hardware, "hw"))
    m = report(host, capsys, "--plan", "toy-dp4", "--gpu", "tiny")
    used = m["rank_classes"][0]["memory_bytes"]["total"] / 2**30
    fit = m["memory_fit"]  # the JSON says it too
    assert fit["capacity_bytes"] == 2**20 and fit["peak_bytes"] == m["rank_classes"][0]["memory_bytes"]["total"]
    assert fit["fits"] == (used <= 2**-10)
    assert main(["report", "--plan", "toy-dp4", "--gpu", "tiny"], host=host) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("memory:"))
    verdict = "fits" if used <= 2**-10 else "does NOT fit"
    assert line == f"memory: up to {used:,.2f} GiB per GPU of the tiny's {2**-10:g} GiB ({100 * used / 2**-10:.0f}%): {verdict}"
    # the table's column: each class's share of the GPU
    header = next(x for x in out if x.startswith("ranks"))
    assert f"of tiny's {2**-10:g} GiB" in header
    row = out[out.index(header) + 1].split()
    share = f"{100 * used / 2**-10:.0f}%"
    assert share in row and (row[row.index(share) + 1:row.index(share) + 3] == ["NOT", "fit"]) == (used > 2**-10)
    # a plan may name its GPU; --gpu given alongside overrides it
    big = replace(hw, name="big", gpu=replace(gpu, name="big", memory_gib=80.0))

    class Named:
        @hookimpl
        def stage_hardware(self):
            return [big]

        @hookimpl
        def stage_plans(self):
            return [PlanSpec("toy-on-big", {"model": "toy", "dp": 2, "gpu": "big"})]

    host = fresh_host((toy_plugin, "toy"), (Plans(), "plans"), (hardware, "hw"), (Named(), "named"))
    assert report(host, capsys, "--plan", "toy-on-big")["hardware"]["name"] == "big"
    assert report(host, capsys, "--plan", "toy-on-big", "--gpu", "tiny")["hardware"]["name"] == "tiny"
