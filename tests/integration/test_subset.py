"""`stage generate --ranks`: some ranks' traces, byte for byte those of the whole set."""

import json


def test_subset_is_the_whole_sets_files_for_those_ranks(run_stage, simulate, tmp_path):
    plan = ["--model", "llama-tiny", "--tp", "2", "--pp", "2", "--dp", "2"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert run_stage("generate", *plan, "-o", whole).returncode == 0
    status, _ = simulate(whole)  # the whole set runs in the simulator
    assert status == 0
    done = run_stage("generate", *plan, "--ranks", "1,4-5", "--workers", "2", "-o", part)
    assert done.returncode == 0, done.stderr
    assert "wrote 3 of 8 traces (ranks 1,4-5)" in done.stdout
    names = sorted(p.name for p in part.iterdir())
    assert names == ["comm_groups.json", "manifest.json", "trace.1.et", "trace.4.et", "trace.5.et"]
    for rank in (1, 4, 5):
        assert (part / f"trace.{rank}.et").read_bytes() == (whole / f"trace.{rank}.et").read_bytes()
    assert (part / "comm_groups.json").read_bytes() == (whole / "comm_groups.json").read_bytes()
    manifest = json.loads((part / "manifest.json").read_text())
    assert manifest["subset"] == {"ranks": "1,4-5", "count": 3} and manifest["world_size"] == 8
    checked = run_stage("validate", part)
    assert checked.returncode == 0 and checked.stdout.strip() == f"{part}: 3 of 8 ranks (1,4-5), valid"
    (part / "trace.4.et").unlink()
    broken = run_stage("validate", part)
    assert broken.returncode != 0 and "missing for rank(s) [4]" in broken.stderr
