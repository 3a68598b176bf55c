"""Hugging Face import, for every installed family (issue 15, point 4): every error is one
line naming the config.json key, and the keys STAGE does not model are accepted and listed
in the manifest as ignored."""

import json

import pytest

from stage_core.errors import UsageError
from stage_core.models import hf_import_of

#: keys a published config.json carries that change nothing STAGE counts
NOT_MODELLED = {"attention_dropout": 0.1, "initializer_range": 0.02, "bos_token_id": 1,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "transformers_version": "4.48.0",
                "use_cache": True, "torch_dtype": "bfloat16"}


def exported(host):
    """(family, config.json) of one preset per family that writes config.json."""
    out = []
    for spec in host.models():
        name, config = sorted(spec.presets.items())[0]
        if spec.hf_model_types and hasattr(config, "to_hf"):
            out.append((spec.family, json.loads(json.dumps(config.to_hf()))))
    return out


def one_line_naming(host, data, key):
    with pytest.raises(UsageError) as info:
        host.config_from_hf(data)
    message = str(info.value)
    assert "\n" not in message and key in message, (key, message)


def test_every_family_names_the_key_of_a_bad_value(host):
    tried = 0
    for family, data in exported(host):
        for key, value in data.items():
            if key in ("stage", "model_type", "architectures"):
                continue
            if isinstance(value, bool):
                one_line_naming(host, {**data, key: "yes"}, key)
            elif isinstance(value, int):
                one_line_naming(host, {**data, key: -1}, key)
                one_line_naming(host, {**data, key: "12"}, key)
                one_line_naming(host, {**data, key: 2.5}, key)
            else:
                continue
            tried += 1
    assert tried >= 60 and {f for f, _ in exported(host)} >= {"llama", "moe", "gemma2", "mamba2", "nemotron_h"}


def test_a_missing_key_is_a_default_or_one_line_naming_it(host):
    for family, data in exported(host):
        for key in data:
            if key in ("stage", "model_type", "architectures"):
                continue
            try:
                host.config_from_hf({k: v for k, v in data.items() if k != key})
            except UsageError as exc:
                assert "\n" not in str(exc) and key in str(exc), (family, key, str(exc))


def test_keys_not_modelled_are_accepted_and_listed(host):
    for family, data in exported(host):
        config = host.config_from_hf({**data, **NOT_MODELLED, "vision_config": {"hidden_size": 1152}})
        ignored = hf_import_of(config)["ignored_keys"]
        assert set(NOT_MODELLED) | {"vision_config", "architectures"} <= set(ignored), family
        assert not set(ignored) & {"hidden_size", "vocab_size", "stage", "model_type"}, family


def test_the_manifest_lists_them(run_stage, tmp_path):
    # Llama 3.1 8B's published config.json, with its rope_scaling block
    llama31 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
               "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
               "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
               "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama31))
    done = run_stage("report", "--model", path, "--set", "layers=2", "--seq-len", "1024", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["hf_import"]
    assert record["source"] == str(path) and record["model_type"] == "llama"
    assert record["ignored_keys"] == ["architectures", "attention_dropout", "bos_token_id", "eos_token_id",
                                      "initializer_range", "pretraining_tp", "rms_norm_eps", "rope_scaling",
                                      "rope_theta", "torch_dtype", "transformers_version", "use_cache"]
    text = run_stage("report", "--model", path, "--set", "layers=2", "--seq-len", "1024")
    assert "keys not modelled (ignored): architectures, attention_dropout" in text.stdout
    preset = run_stage("report", "--model", "llama3-8b", "--set", "layers=2", "--seq-len", "1024", "--json")
    assert "hf_import" not in json.loads(preset.stdout)
