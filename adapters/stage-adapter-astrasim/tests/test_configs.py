"""Written configs have the shape of the ASTRA-sim sample run; presets carry their numbers."""

from __future__ import annotations

import json

import pytest
from stage_core.api import UsageError, hardware


from astrasim_test_presets import TEST_PRESETS as PRESETS
from stage_adapter_astrasim import netyml
from stage_adapter_astrasim.configs import backend_bandwidth, build_configs as _build, network_dims


def build_configs(world, system=None, network=None, **kw):
    return _build(world, system, network, presets=PRESETS, **kw)


def test_system_json_has_the_sample_keys(data_dir):
    sample = json.loads((data_dir / "system.json").read_text())
    written = json.loads(build_configs(8, "h100").system_text)
    assert set(written) == set(sample)
    for key, value in sample.items():
        assert type(written[key]) in ({int, float} if isinstance(value, (int, float))
                                      else {type(value)}), key


def test_memory_json_is_the_sample(data_dir):
    sample = json.loads((data_dir / "memory.json").read_text())
    assert json.loads(build_configs(8).memory_text) == sample


def test_network_yml_has_the_sample_fields(data_dir):
    sample = netyml.read_flow_lists((data_dir / "network_switch8.yml").read_text())
    written = netyml.read_flow_lists(build_configs(8, "h100").network_text)
    assert set(written) == set(sample) == set(netyml.KEYS)
    assert written == sample  # one node of H100 is ASTRA-sim's validated HGX H100


def test_two_dimensions_across_nodes():
    text = build_configs(32, "h100").network_text
    net = netyml.read_flow_lists(text)
    h100 = PRESETS["h100"]
    assert net == {"topology": ["Switch", "Switch"], "npus_count": [8, 4],
                   "bandwidth": [400.0, 44.44],
                   "latency": [h100.scale_up.latency_ns, h100.scale_out.latency_ns]}
    system = json.loads(build_configs(32, "h100").system_text)
    for key in ("all-reduce-implementation", "all-gather-implementation",
                "reduce-scatter-implementation", "all-to-all-implementation"):
        assert system[key] == ["ring", "ring"]


@pytest.mark.parametrize("world,npus", [(2, [2]), (4, [4]), (8, [8]), (16, [8, 2]),
                                        (1024, [8, 128])])
def test_npus_count_per_world(world, npus):
    assert list(network_dims(PRESETS["a100"], world).npus_count) == npus


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_numbers_reach_the_files(name):
    preset = PRESETS[name]
    system = json.loads(build_configs(16, name).system_text)
    assert system["peak-perf"] == preset.gpu.matmul_tflops["bf16"]
    assert system["local-mem-bw"] == preset.gpu.hbm_gbps
    assert system["roofline-enabled"] == 1
    net = netyml.read_flow_lists(build_configs(16, name).network_text)
    assert net["bandwidth"] == [backend_bandwidth(preset.scale_up), backend_bandwidth(preset.scale_out)]


def test_backend_bandwidth_is_achieved_gibibytes():
    # the adapter's numbers before hardware records existed (datasheet x 400/450)
    assert [backend_bandwidth(p.scale_up) for p in PRESETS.values()] == [400.0, 266.67]
    assert [backend_bandwidth(p.scale_out) for p in PRESETS.values()] == [44.44, 22.22]


def test_timed_sets_switch_the_roofline_off():
    system = json.loads(build_configs(8, "h100", timed=True).system_text)
    assert system["roofline-enabled"] == 0


def test_a_hardware_file_is_a_system(tmp_path):
    path = tmp_path / "mine.json"
    hardware.save(PRESETS["a100"], path)
    configs = build_configs(16, str(path))
    assert configs.system_source == "preset a100"
    assert json.loads(configs.system_text)["peak-perf"] == 312.0
    assert netyml.read_flow_lists(configs.network_text)["bandwidth"] == [266.67, 22.22]


def test_preset_names_are_case_insensitive():
    assert build_configs(8, "H100").system_source == "preset h100"


def test_bad_preset_names_the_value_and_the_presets():
    with pytest.raises(UsageError, match=r"'b200'.*a100, h100"):
        build_configs(8, "b200")


def test_missing_system_file(tmp_path):
    with pytest.raises(UsageError, match="nope/sys.json"):
        build_configs(8, str(tmp_path / "nope" / "sys.json"))


def test_missing_network_file(tmp_path):
    with pytest.raises(UsageError, match=r"--network file .*net\.yml not found"):
        build_configs(8, "h100", str(tmp_path / "net.yml"))


def test_world_not_a_multiple_of_the_node():
    with pytest.raises(UsageError, match=r"world size 12 .*multiple of 8"):
        build_configs(12, "h100")


def test_world_of_one_is_rejected():
    with pytest.raises(UsageError, match="world size 1"):
        build_configs(1, "h100")


def test_user_files_are_copied_as_given(data_dir):
    configs = build_configs(8, str(data_dir / "system.json"),
                            str(data_dir / "network_switch8.yml"))
    assert configs.system_text == (data_dir / "system.json").read_text()
    assert configs.network_text == (data_dir / "network_switch8.yml").read_text()
    assert configs.system_source.startswith("file ")


def test_user_network_must_match_the_world(data_dir):
    with pytest.raises(UsageError, match=r"npus_count \[8\] .*world_size 16"):
        build_configs(16, "h100", str(data_dir / "network_switch8.yml"))


def test_user_system_must_be_json(tmp_path):
    bad = tmp_path / "system.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        build_configs(8, str(bad))
