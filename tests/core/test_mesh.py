"""Rank layout against REFERENCE §5 and WORKED-EXAMPLES §7 (Megatron's order string)."""

import pytest

from stage_core.parallel import GroupTable, Mesh, Plan


def test_tp8_dp128_pp4_coordinates_and_groups():
    mesh = Mesh({"tp": 8, "dp": 128, "pp": 4}, "tp-cp-ep-dp-pp")
    assert mesh.world_size == 4096
    for r in (0, 7, 8, 1023, 1024, 3000, 4095):
        assert mesh.coords(r) == {"tp": r % 8, "cp": 0, "dp": (r // 8) % 128, "pp": r // 1024}
    r = 3000
    assert mesh.group_members("tp", r) == list(range(8 * (r // 8), 8 * (r // 8) + 8))
    dp = mesh.group_members("dp", r)
    assert len(dp) == 128 and dp[1] - dp[0] == 8 and all(m % 8 == r % 8 and m // 1024 == r // 1024 for m in dp)
    pp = mesh.group_members("pp", r)
    assert pp == [r % 1024 + 1024 * i for i in range(4)]
    assert mesh.peer(r, "pp+1") == r + 1024 and mesh.peer(r, "pp-1") == r - 1024
    with pytest.raises(ValueError):
        mesh.peer(4000, "pp+1")


def test_order_string_changes_which_ranks_are_neighbours():
    # Llama 3 used [TP, CP, PP, DP]: pp varies before dp
    mesh = Mesh({"tp": 2, "dp": 2, "pp": 2}, "tp-cp-ep-pp-dp")
    assert mesh.group_members("pp", 0) == [0, 2]
    assert mesh.group_members("dp", 0) == [0, 4]


def test_group_ids_start_at_one_are_stable_and_partition_the_world():
    mesh = Mesh.from_plan(Plan(tp=4, dp=3))
    table = GroupTable(mesh, ["dp", "tp"])
    again = GroupTable(Mesh.from_plan(Plan(tp=4, dp=3)), ["tp", "dp"])
    assert table.groups == again.groups
    names = sorted(table.groups, key=int)
    assert names[0] == "1" and names == [str(i) for i in range(1, len(names) + 1)]
    # tp groups first (3 of 4 ranks), then dp groups (4 of 3 ranks)
    assert [len(table.groups[n]) for n in names] == [4, 4, 4, 3, 3, 3, 3]
    for key in ("tp", "dp"):
        members = sorted(r for n in names for r in table.groups[n] if len(table.groups[n]) == mesh.group_size(key))
        assert members == list(range(12))
    for r in range(12):
        assert r in table.groups[table.name(r, "tp")] and r in table.groups[table.name(r, "dp")]
