"""The image families against STAGE's conformance kit, with published and hand-worked numbers."""

import pytest
from stage_core.api import Plan, UsageError, plan_job
from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_forward_flops,
                                assert_param_count, assert_tasks, fresh_host, jsonl_plugin,
                                reference_strategies)

import stage_model_vision.plugin as vision

HOST = fresh_host((vision, "vision"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))

#: torchvision.models.<name>(weights=None) parameter counts (sum of p.numel() over parameters())
TORCHVISION = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "vgg-a": 132_863_336,  # vgg11
    "vgg13": 133_047_848,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "vit-b16": 86_567_656,  # vit_b_16
    "vit-l16": 304_326_632,  # vit_l_16
}


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_parameters_are_torchvisions(name):
    assert_param_count(HOST, name, TORCHVISION[name])


def test_overfeat_fast_parameters_from_its_table():
    # Sermanet et al. 2014, Table 1 (fast model): conv (in, out, k) then fully connected (in, out), with biases
    convs = [(3, 96, 11), (96, 256, 5), (256, 512, 3), (512, 1024, 3), (1024, 1024, 3)]
    fcs = [(1024 * 6 * 6, 3072), (3072, 4096), (4096, 1000)]
    total = sum(o * i * k * k + o for i, o, k in convs) + sum(i * o + o for i, o in fcs)
    assert total == 145_920_872  # "145M parameters" in the paper
    assert_param_count(HOST, "overfeat-fast", total)


def test_resnet50_forward_is_4089184256_multiply_adds():
    # torchvision / fvcore: ResNet-50 at 224x224, convolutions and the classifier
    assert_forward_flops(HOST, "resnet50", 2 * 4_089_184_256)


def _conv_macs(layers, size):
    """Multiply-adds of 3x3 'same' convolutions, 2x2 pooling after each 'M' (VGG)."""
    macs, c = 0, 3
    for v in layers:
        if v == "M":
            size //= 2
        else:
            macs += size * size * v * c * 9
            c = v
    return macs, c, size


def test_vgg_a_forward_by_hand():
    macs, c, size = _conv_macs((64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"), 224)
    macs += c * size * size * 4096 + 4096 * 4096 + 4096 * 1000
    assert macs == 7_609_090_048  # torchvision's vgg11: 7.61 GFLOPs (multiply-adds)
    assert_forward_flops(HOST, "vgg-a", 2 * macs)


def test_overfeat_forward_by_hand():
    # 231 -> conv 11/4: 56 -> pool 28 -> conv 5: 24 -> pool 12 -> 3x3 same x3: 12 -> pool 6
    macs = (56 * 56 * 96 * 3 * 121 + 24 * 24 * 256 * 96 * 25 + 12 * 12 * (512 * 256 + 1024 * 512 + 1024 * 1024) * 9
            + 1024 * 36 * 3072 + 3072 * 4096 + 4096 * 1000)
    assert_forward_flops(HOST, "overfeat-fast", 2 * macs)


def test_vit_b16_forward_by_hand():
    s, h, f, L, n = 197, 768, 3072, 12, 196
    # patch conv, per layer QKV + projection (4sh^2), scores and context (2s^2h), MLP (2shf), the head
    macs = n * h * 3 * 16 * 16 + L * (4 * s * h * h + 2 * s * s * h + 2 * s * h * f) + h * 1000
    assert round(macs / 1e9, 2) == 17.56  # torchvision lists vit_b_16 at 17.56 GFLOPs (multiply-adds)
    assert_forward_flops(HOST, "vit-b16", 2 * macs)


def _resnet50_saved_elements_per_image() -> tuple[int, int]:
    """What PyTorch keeps for backward per image (elements of bf16 activations, int64 indices), by hand:
    the stem keeps conv1's output (BatchNorm's input), the in-place ReLU's output, max pooling's
    output (the next convolution's input) and its int64 indices; each bottleneck keeps conv1's,
    conv2's and conv3's outputs (BatchNorm inputs), relu1's and relu2's outputs, the downsample's
    convolution output (first block), and the block's final ReLU output; the head keeps the pooled
    features (the classifier's input) and the softmax of the logits."""
    elements = 2 * 64 * 112 * 112 + 64 * 56 * 56
    indices = 64 * 56 * 56
    size = 56
    for stage, (m, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for j in range(blocks):
            stride = 2 if stage > 0 and j == 0 else 1
            out = size // stride
            elements += 2 * m * size * size + 2 * m * out * out + 2 * 4 * m * out * out
            if j == 0:
                elements += 4 * m * out * out
            size = out
    return elements + 2048 + 1000, indices


def test_resnet50_activation_memory_by_hand():
    elements, indices = _resnet50_saved_elements_per_image()
    assert (elements, indices) == (20_926_440, 200_704)
    per_image = 2 * elements + 8 * indices
    result = plan_job(HOST, "resnet50", {}, Plan(micro_batch_size=32), programs=False)
    assert result.manifest["rank_classes"][0]["memory_bytes"]["activations"] == 32 * per_image  # 1.39 GB


def test_configs_tasks_and_conservation():
    for family in ("resnet", "vgg", "overfeat", "vit"):
        assert_config_round_trips(HOST, family)
    small = {"image_size": "64"}
    assert assert_tasks(HOST, "resnet18", small)["train"] == "ok"
    got = assert_tasks(HOST, "resnet18", small)
    assert got["prefill"] == "ok" and "no sequence" in got["decode"]
    assert "generates no tokens" in assert_tasks(HOST, "vit-b16", {"layers": "1"})["decode"]
    plans = [Plan(dp=2), Plan(dp=2, micro_batches=2), Plan(pp=2, micro_batches=4, stage_layers=(4, 4))]
    assert assert_flops_conserved(HOST, "resnet18", plans, small) == 3


def test_no_sequence_flags_refused_in_one_line():
    with pytest.raises(UsageError, match="--seq-len 128: resnet50 has no sequence dim"):
        plan_job(HOST, "resnet50", {}, Plan(seq_len=128), programs=False)
    with pytest.raises(UsageError, match="--seq-len 100: vit-b16's sequence is fixed by its config"):
        plan_job(HOST, "vit-b16", {}, Plan(seq_len=100), programs=False)
    result = plan_job(HOST, "resnet50", {"image_size": "64"}, Plan(micro_batch_size=4), programs=False)
    assert result.plan.seq_len is None and result.manifest["plan"]["seq_len"] is None


def test_image_size_is_a_model_setting():
    # VGG-A at 32x32 (CIFAR's size): the same convolutions over 1/49 of the pixels, fc6 reading a 1x1 map
    macs, c, size = _conv_macs((64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"), 32)
    assert size == 1
    assert_forward_flops(HOST, "vgg-a", 2 * (macs + c * 4096 + 4096 * 4096 + 4096 * 1000),
                         overrides={"image_size": "32"})
    result = plan_job(HOST, "vgg-a", {"image_size": "32"}, Plan(micro_batch_size=8), programs=False)
    images = next(t for t in result.forward.inputs if t.name == "images")
    assert [int(d) if d.is_Integer else str(d) for d in images.shape] == ["b", 3, 32, 32]
