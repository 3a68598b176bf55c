"""A user's view of a config.json (issue 21, points 3 and 4): `stage models FILE`, `stage
report`'s parameter counts, `--set` with the config.json's own key names, the README's
examples as written, its list of model_types, and the refusal of a config no family reads."""

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "plugins/stage-model-moe/tests/configs/gpt-oss-20b.json"
QWEN3 = ROOT / "plugins/stage-model-llama/tests/configs/Qwen3-0.6B.json"


def readme_commands(marker: str) -> list[str]:
    """The README's "Using it" commands (continuation lines joined) that contain ``marker``."""
    section = (ROOT / "README.md").read_text().split("## Using it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if marker in line]


def test_readme_config_json_examples_work_as_written(run_stage, tmp_path):
    commands = readme_commands("tests/configs/")
    assert len(commands) == 3 and any("--set num_hidden_layers=" in c for c in commands)
    (tmp_path / "plugins").symlink_to(ROOT / "plugins")  # the paths are the repository's
    for command in commands:
        args = shlex.split(command)
        assert args[0] == "stage"
        done = run_stage(*args[1:], cwd=tmp_path)
        assert done.returncode == 0, (command, done.stderr)
    manifest = json.loads((tmp_path / "jamba" / "manifest.json").read_text())
    assert manifest["model"]["pattern"][:16] == "M-MEM-ME*-MEM-ME" and manifest["world_size"] == 4


def test_readme_lists_every_model_type_that_imports(host):
    section = (ROOT / "README.md").read_text().split("## Models", 1)[1]
    rows = [line for line in section.split("|---|", 1)[1].splitlines() if line.startswith("|")]
    listed = set(re.findall(r"\b[a-z][a-z0-9_]+\b", " ".join(row.split("|")[3] for row in rows)))
    assert set(host.hf_model_types()) <= listed


def test_stage_models_file(run_stage):
    done = run_stage("models", GPT_OSS)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("model_type 'gpt_oss' read as family moe (moe)")
    # openai/gpt-oss-20b's checkpoint holds 20,914,757,184 parameters
    assert lines[1].startswith("parameters: 20,914,757,184 total, 4,187,440,704 active per token")
    assert lines[2] == "layers: 24: 12 attention (window 128) + moe, 12 attention + moe"
    assert lines[3].startswith("keys not modelled (ignored): architectures,") and "quantization_config" in lines[3]
    data = json.loads(run_stage("models", GPT_OSS, "--json").stdout)
    assert (data["family"], data["params_total"], data["layers"]) == ("moe", 20_914_757_184, 24)
    assert data["layers_by_kind"] == {"attention (window 128) + moe": 12, "attention + moe": 12}


def test_set_with_the_config_jsons_key_names(run_stage):
    cut = json.loads(run_stage("models", GPT_OSS, "--set", "num_hidden_layers=4", "--json").stdout)
    assert cut["layers_by_kind"] == {"attention (window 128) + moe": 2, "attention + moe": 2}
    # 20 layers fewer: the full count less 20 layers of 823,186,976 (test_moe_published counts one by hand)
    assert cut["params_total"] == 20_914_757_184 - 20 * 823_186_976


@pytest.mark.parametrize("model,key", [("gpt-tiny", "num_hidden_layers"), ("llama-tiny", "num_layers"),
                                       ("moe-tiny", "num_hidden_layers"), ("gemma-tiny", "layers"),
                                       ("mamba2-tiny", "num_hidden_layers"), ("hybrid-tiny", "num_layers"),
                                       ("mamba1-tiny", "num_hidden_layers"), ("jamba-tiny", "num_hidden_layers"),
                                       ("zamba2-tiny", "num_hidden_layers")])
def test_every_family_takes_the_hf_name_of_its_layer_count(run_stage, model, key):
    done = run_stage("report", "--model", model, "--set", f"{key}=1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["parameters"]["total"] > 0
    layers = report["model"].get("layers")
    assert layers == 1 if layers is not None else len(report["model"]["pattern"]) in (1, 2)


def test_report_prints_total_and_active_parameters(run_stage):
    done = run_stage("report", "--model", QWEN3, "--seq-len", "1024")
    assert done.returncode == 0, done.stderr
    # Qwen/Qwen3-0.6B: 596,049,920 parameters (dense: every one active)
    assert done.stdout.splitlines()[1] == "parameters: 596.05 M total, 596.05 M active per token (596,049,920)"


def test_a_config_no_family_reads_names_the_nearest_and_family_forces_one(run_stage, tmp_path):
    bert = tmp_path / "config.json"
    bert.write_text(json.dumps({"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
                                "num_attention_heads": 12, "intermediate_size": 3072, "type_vocab_size": 2,
                                "vocab_size": 30522, "max_position_embeddings": 512, "hidden_act": "gelu"}))
    qwen = json.loads(QWEN3.read_text())
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps({**qwen, "model_type": "mystery"}))
    # bert has a plugin of its own (stage-model-encoders), whose reading answers first
    done = run_stage("models", bert)
    assert done.returncode == 0 and "read as family bert" in done.stdout, done.stderr
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"model_type": "rwkv", "hidden_size": 2048, "num_hidden_layers": 24,
                               "attention_hidden_size": 2048, "context_length": 1024}))
    done = run_stage("models", odd)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "the nearest, llama, needs num_attention_heads" in done.stderr
    assert "keys no family places: attention_hidden_size, context_length" in done.stderr
    assert "--family" in done.stderr and "qwen3" in done.stderr
    forced = run_stage("models", QWEN3, "--family", "moe")
    assert forced.returncode == 2 and "family moe needs key num_local_experts" in forced.stderr
    unknown = run_stage("report", "--model", QWEN3, "--family", "nope")
    assert unknown.returncode == 2 and "--family nope: no family of that name" in unknown.stderr
    # a model_type is a hint: Qwen3's keys under another name lose only its q/k norms
    plain = json.loads(run_stage("models", renamed, "--json").stdout)
    assert plain["params_total"] == 596_049_920 - 28 * 2 * 128
