"""Image models and BERT with the standard strategies (stage-parallel) and in the real ASTRA-sim.

ResNet-50 and BERT-base under dp, tp and pp (small images, short sequences, for CI time) must
finish on every rank in the simulator and in `stage validate`'s replay; tensor parallel shards
a CNN's declared channel dims; Das et al.'s hybrid (--tp-convs data) runs the convolutions
data parallel and the fully connected layers model parallel; what a model cannot do is
refused in one line.
"""

import pytest

from stage_core.flow import plan_job
from stage_core.parallel import Plan
from stage_core.testing import one_device_matmul_flops, ranks_matmul_flops
from test_simulator import finishes

RESNET = {"image_size": 64}
BERT = {"layers": 2}
SIMULATED = [
    ("resnet50", Plan(dp=2, micro_batch_size=2), RESNET),
    ("resnet50", Plan(tp=2, micro_batch_size=2), RESNET),
    ("resnet50", Plan(pp=2, micro_batches=2, micro_batch_size=2, stage_layers="auto"), RESNET),
    ("bert-base", Plan(dp=2, micro_batch_size=2, seq_len=64), BERT),
    ("bert-base", Plan(tp=2, sp=True, micro_batch_size=2, seq_len=64), BERT),
    ("bert-base", Plan(pp=2, micro_batches=2, micro_batch_size=2, seq_len=64), BERT),
]


@pytest.mark.parametrize("model,plan,overrides", SIMULATED, ids=lambda x: x if isinstance(x, str) else None)
def test_resnet50_and_bert_base_finish_on_every_rank(write_set, replay_and_simulate, model, plan, overrides):
    finishes(replay_and_simulate(write_set(model, plan, **overrides)), plan.world_size)


def test_tp_shards_every_convolution_of_a_bottleneck(host):
    result = plan_job(host, "resnet50", {"image_size": "64"}, Plan(tp=2, micro_batch_size=2), programs=False)
    sharded = {p.name for p, layout in result.sharded.param_compute.items() if "tp" in layout}
    assert {"layer1.0.conv1.weight", "layer1.0.conv2.weight", "layer1.0.conv3.weight", "layer1.0.bn1.weight",
            "fc.weight"} <= sharded
    assert "stem.conv.weight" not in sharded and "layer1.0.downsample.conv.weight" not in sharded
    # every rank computes half of each sharded convolution; the stem and downsampling run whole
    whole = ("stem.", "downsample.")
    assert ranks_matmul_flops(result, whole) == one_device_matmul_flops(result, whole)


def test_das_hybrid_convolutions_data_parallel_fully_connected_model_parallel(host):
    plan = Plan(tp=2, dp=2, micro_batch_size=4).with_options(tp_convs="data")
    result = plan_job(host, "vgg-a", {"image_size": "32"}, plan, programs=False)
    sharded = {p.name for p, layout in result.sharded.param_compute.items() if "tp" in layout}
    assert sharded == {"fc6.weight", "fc6.bias", "fc7.weight", "fc8.weight", "fc8.bias"}
    assert ranks_matmul_flops(result) == one_device_matmul_flops(result)
    assert result.manifest["plan"]["options"] == {"tp-convs": "data"}


@pytest.mark.parametrize("model,plan,message", [
    ("resnet50", Plan(tp=2, sp=True), "--sp: sequence parallel splits the sequence over tp; resnet50 has no sequence"),
    ("resnet50", Plan(cp=2), "--cp 2: context parallel splits each sequence; resnet50 has no sequence dim"),
    ("resnet50", Plan(tp=16), "--tp 16: tensor parallel needs it to divide"),
    ("bert-base", Plan(tp=2).with_options(tp_convs="data"), "--tp-convs data: splits the images of convolutions"),
])
def test_what_a_model_cannot_shard_is_refused_in_one_line(host, model, plan, message):
    from stage_core.errors import UsageError

    with pytest.raises(UsageError) as err:
        plan_job(host, model, {}, plan, programs=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_plan_text_of_an_image_model_has_no_sequence(run_stage):
    done = run_stage("report", "--model", "resnet18", "--set", "image_size=32", "--dp", "2", "--micro-batch-size", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("resnet18  dp2 mbs8x1  world 2") and "seq" not in done.stdout
