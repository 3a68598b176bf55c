"""The fully connected family against STAGE's conformance kit, with numbers worked out by hand."""

import pytest
from stage_core.api import Plan, UsageError, plan_job, training_flops
from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_forward_flops,
                                assert_param_count, assert_tasks, fresh_host, jsonl_plugin, reference_strategies)

import stage_model_mlp.plugin as mlp
from stage_model_mlp import MLPS, build_mlp

HOST = fresh_host((mlp, "mlp"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))
#: Seide, Li and Yu 2011 (the CD-DNN-HMM Das et al. 2016 scale): 11 frames x 39 PLP features,
#: 7 hidden layers of 2048 sigmoid units, 9304 senones
I, H, L, V = 11 * 39, 2048, 7, 9304


def _weights() -> int:
    return I * H + (L - 1) * H * H + H * V


def test_das2016_dnn_parameters_by_hand():
    biases = L * H + V
    assert _weights() == 45_099_008 and biases == 23_640
    # 45.1M; Seide et al. 2014 (1-bit SGD, ICASSP/Interspeech 2014) call this Switchboard DNN "46M parameters"
    assert_param_count(HOST, "das2016-dnn", 45_122_648)


def test_das2016_dnn_forward_flops_by_hand():
    # per frame: 2 FLOPs per multiply-add of the eight matrices
    assert_forward_flops(HOST, "das2016-dnn", 2 * _weights())
    assert_forward_flops(HOST, "das2016-dnn", 1024 * 2 * 45_099_008, micro_batch_size=1024)
    # the rest: one add per bias element, the sigmoid's exp, +1 and reciprocal (3) per hidden unit,
    # the cross-entropy's max, subtract, exp and sum (4) per logit
    assert_forward_flops(HOST, "das2016-dnn", (L * H + V) + 3 * L * H + 4 * V, what="other_flops")


def test_das2016_dnn_training_step_by_hand():
    # backward: an input gradient and a weight gradient per layer, each as costly as the forward product,
    # except the first layer's input gradient (the features need none)
    graph = build_mlp(MLPS["das2016-dnn"])
    got = training_flops(graph, b=1024, phase="backward")
    assert got == 1024 * 2 * (2 * _weights() - I * H) == 182_926_180_352


def test_activation_memory_by_hand():
    # per frame, fp32: each hidden layer keeps its linear output (the sigmoid's input) and the sigmoid's
    # output (the next layer's input); the head keeps the softmax of the logits (the features are data)
    per_frame = 4 * (L * 2 * H + V)
    assert per_frame == 151_904
    result = plan_job(HOST, "das2016-dnn", {}, Plan(micro_batch_size=1024), programs=False)
    assert result.manifest["rank_classes"][0]["memory_bytes"]["activations"] == 1024 * per_frame


def test_relu_and_other_shapes():
    # a ReLU network of 3 hidden layers of 256 units on 100 inputs and 10 classes
    o = {"activation": "relu", "layers": "3", "hidden": "256", "inputs": "100", "classes": "10"}
    assert_param_count(HOST, "das2016-dnn", 100 * 256 + 2 * 256 * 256 + 256 * 10 + 3 * 256 + 10, overrides=o)
    # ReLU counts one comparison per unit
    assert_forward_flops(HOST, "das2016-dnn", (3 * 256 + 10) + 3 * 256 + 4 * 10, overrides=o, what="other_flops")


def test_configs_tasks_and_conservation():
    assert_config_round_trips(HOST, "mlp")
    got = assert_tasks(HOST, "das2016-dnn")
    assert got["train"] == "ok" and got["prefill"] == "ok" and "no sequence" in got["decode"]
    small = {"hidden": "64", "inputs": "39"}
    plans = [Plan(dp=2), Plan(dp=4, micro_batches=2), Plan(pp=2, micro_batches=4, stage_layers=(4, 3))]
    assert assert_flops_conserved(HOST, "das2016-dnn", plans, small) == 3


@pytest.mark.parametrize("field,value,message", [
    ("activation", "tanh", "MLPConfig activation='tanh'"),
    ("layers", "0", "MLPConfig layers=0"),
    ("family", "vgg", "MLPConfig family='vgg'"),
])
def test_bad_settings_refused_in_one_line(field, value, message):
    with pytest.raises(UsageError) as err:
        plan_job(HOST, "das2016-dnn", {field: value}, Plan(), programs=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_no_sequence_flags_refused():
    with pytest.raises(UsageError, match="--seq-len 128: das2016-dnn has no sequence dim"):
        plan_job(HOST, "das2016-dnn", {}, Plan(seq_len=128), programs=False)
