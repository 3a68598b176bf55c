"""The plugin registers both backends through STAGE's hook and entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

from stage_core.records import BackendSpec
from stage_core.testing import fresh_host

from stage_adapter_chakra import etread, plugin


def _specs():
    return fresh_host((plugin, "chakra")).backends()


def test_backends_registered():
    specs = _specs()
    by_name = {s.name: s for s in specs}
    assert set(by_name) == {"chakra", "chakra-json"}
    assert all(isinstance(s, BackendSpec) for s in specs)
    assert by_name["chakra"].format_id == "chakra-et-0.0.4"
    assert by_name["chakra-json"].format_id == "chakra-json-0.0.4"
    for spec in specs:
        assert callable(spec.write) and callable(spec.read) and callable(spec.detect)


def test_backend_round_trip_through_specs(job, tmp_path):
    specs = _specs()
    for spec in specs:
        out = tmp_path / spec.name
        spec.write(job, out)
        assert spec.detect(out)
        ts = spec.read(out)
        assert ts.world_size == job.world_size
        assert [r for r, _ in ts.iter_ranks()] == [0, 1, 2, 3]


def test_entry_point():
    eps = entry_points(group="stage")
    (ep,) = [e for e in eps if e.name == "chakra"]
    assert ep.value == "stage_adapter_chakra.plugin"
    assert ep.load() is plugin


def test_sample_dir_detected_by_chakra_backend_only(samples_dir):
    specs = _specs()
    found = {s.name for s in specs if s.detect(samples_dir)}
    assert found == {"chakra"}
    assert etread.read(samples_dir).world_size == 8
