"""BERT against STAGE's conformance kit, with Hugging Face's parameter counts and hand-worked FLOPs."""

import pytest
from stage_core.api import Plan, UsageError, plan_job
from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_forward_flops,
                                assert_param_count, assert_tasks, fresh_host, jsonl_plugin, reference_strategies)

import stage_model_encoders.plugin as encoders

HOST = fresh_host((encoders, "encoders"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))


def test_bert_base_with_heads_is_hugging_faces():
    # transformers' BertForPreTraining(bert-base-uncased config).num_parameters(): the decoder tied to the
    # word embeddings, its bias, the MLM transform and norm, the pooler and the next-sentence head
    assert_param_count(HOST, "bert-base", 110_106_428)


def test_bert_large_by_hand():
    h, f, L, V, P, T = 1024, 4096, 24, 30522, 512, 2
    embeddings = (V + P + T) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * 2 * h + 2 * h * f + f + h
    heads = (h * h + h) + (h * h + h + 2 * h + V) + (2 * h + 2)  # pooler, MLM head, NSP head
    assert embeddings + L * layer + heads == 336_226_108  # BertForPreTraining(bert-large-uncased)
    assert_param_count(HOST, "bert-large", 336_226_108)


def test_forward_flops_by_hand():
    # per layer 24·s·h² + 4·s²·h (bidirectional: the whole score matrix); the MLM transform 2·s·h² and
    # decoder 2·s·h·V; the pooler 2·h² and NSP 2·2·h, per sequence
    s, h, L, V = 512, 768, 12, 30522
    expected = L * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * h + 2 * s * h * V + 2 * h * h + 4 * h
    assert_forward_flops(HOST, "bert-base", expected)


def test_configs_tasks_and_conservation():
    assert_config_round_trips(HOST, "bert")
    got = assert_tasks(HOST, "bert-tiny")
    assert got["train"] == "ok" and got["prefill"] == "ok"
    assert "keeps no cache" in got["decode"] or "decode computes one new token" in got["decode"]
    assert assert_flops_conserved(HOST, "bert-tiny", [Plan(dp=2), Plan(pp=2, micro_batches=4)]) == 2


def test_prefill_is_one_forward_of_the_whole_batch():
    # prefill of an encoder: every token through both heads, attention whole (not causal), no cache
    train = plan_job(HOST, "bert-tiny", {}, Plan(micro_batch_size=2), programs=False)
    fwd = train.manifest["rank_classes"][0]["flops"]
    pre = plan_job(HOST, "bert-tiny", {}, Plan(micro_batch_size=2, task="prefill"), programs=False)
    got = pre.manifest["rank_classes"][0]
    assert got["memory_bytes"]["kv_cache"] == 0
    s, h, L, V = 128, 128, 2, 30522
    assert got["flops"]["matmul"] == 2 * (L * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * h + 2 * s * h * V
                                          + 2 * h * h + 4 * h)
    assert fwd["matmul"] > 2.9 * got["flops"]["matmul"]


def test_decode_refused_in_one_line():
    with pytest.raises(UsageError, match="keeps no cache between steps"):
        plan_job(HOST, "bert-tiny", {}, Plan(task="decode"), programs=False)


def test_hugging_face_config_json():
    hf = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
          "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
          "hidden_act": "gelu", "hidden_dropout_prob": 0.1}
    config = encoders.stage_config_from_hf(hf)
    assert config.replace(name="bert-base") == HOST.preset("bert-base")[1]
    assert encoders.stage_config_from_hf({"model_type": "gpt2"}) is None
