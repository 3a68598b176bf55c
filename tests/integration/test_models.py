"""Model catalog and Hugging Face import through the command line, and the FLOPs the
manifest reports against Megatron-LM's formula (REFERENCE §1)."""

import json

import pytest

# public config.json of meta-llama/Meta-Llama-3-8B (the keys STAGE reads)
LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "tie_word_embeddings": False, "rope_theta": 500000.0,
}


def test_models_lists_every_preset_with_counts_and_plugin(run_stage):
    done = run_stage("models", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert {r["plugin"] for r in rows.values()} >= {"gpt", "llama", "moe", "decoders"}
    assert set(rows["gpt3-175b"]) == {"name", "family", "plugin", "params_total", "params_active"}
    assert rows["gpt3-175b"]["params_total"] == pytest.approx(175e9, rel=0.005)
    assert rows["llama3-405b"]["params_total"] == pytest.approx(405.8e9, rel=0.005)
    assert rows["mixtral-8x7b"]["params_total"] == pytest.approx(46.7e9, rel=0.005)
    assert rows["mixtral-8x7b"]["params_active"] == pytest.approx(12.9e9, rel=0.005)
    assert rows["deepseek-v3"]["params_total"] == pytest.approx(671e9, rel=0.005)


def test_a_public_config_json_generates(run_stage, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    report = run_stage("report", "--model", path, "--json", "--seq-len", "1024")
    assert report.returncode == 0, report.stderr
    model = json.loads(report.stdout)["model"]
    assert (model["family"], model["hidden"], model["layers"], model["kv_heads"]) == ("llama", 4096, 32, 8)
    small = run_stage("generate", "--model", path, "--set", "layers=2", "--seq-len", "256", "--tp", "2",
                      "-o", tmp_path / "out")
    assert small.returncode == 0, small.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["model"]["layers"] == 2 and manifest["world_size"] == 2


def test_an_unsupported_config_lists_the_supported_model_types(run_stage, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "hidden_size": 768}))
    done = run_stage("report", "--model", path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    for t in ("gpt2", "llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"):
        assert t in done.stderr


@pytest.mark.parametrize("key,value,needle", [
    ("num_key_value_heads", 5, "num_key_value_heads"),
    ("num_attention_heads", 33, "num_attention_heads"),
])
def test_contradictory_config_is_refused_naming_the_key(run_stage, tmp_path, key, value, needle):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA3_8B, **{key: value})))
    done = run_stage("report", "--model", path)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("model,plan", [
    ("gpt3-175b", ["--tp", "8", "--dp", "4", "--sp", "--micro-batches", "2"]),
    ("megatron-7.5b", ["--tp", "4", "--dp", "2", "--zero", "2"]),
])
def test_manifest_matmul_flops_over_all_ranks_equal_megatrons_formula(run_stage, model, plan):
    done = run_stage("report", "--model", model, "--set", "attention=classic", *plan, "--json")
    assert done.returncode == 0, done.stderr
    m = json.loads(done.stdout)
    cfg, p = m["model"], m["plan"]
    V = -(-cfg["vocab_size"] // cfg["vocab_pad_to"]) * cfg["vocab_pad_to"]  # 51200 for GPT-3
    L, h, s = cfg["layers"], cfg["hidden"], p["seq_len"]
    B = p["global_batch"]
    formula = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    total = sum(rc["flops"]["matmul"] * len(rc["ranks"]) for rc in m["rank_classes"])
    assert total == pytest.approx(formula, rel=1e-9)
    assert all(rc["flops"]["other"] > 0 for rc in m["rank_classes"])
