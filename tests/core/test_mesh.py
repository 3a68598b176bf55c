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


def test_arrays_answer_as_the_rank_by_rank_functions():
    import numpy as np

    # tp2 cp2 dp3 pp4, two orders; keys with several axes and a restricted axis
    for order in ("tp-cp-ep-dp-pp", "pp-tp-dp-cp-ep"):
        mesh = Mesh({"tp": 2, "cp": 2, "dp": 3, "pp": 4}, order)
        table = GroupTable(mesh, ["tp", "dp", "cp+dp", "pp@0,3", "tp+pp"])
        ranks = np.arange(mesh.world_size)
        for key in table.keys:
            assert table.ids(key, ranks).tolist() == [int(table.name(r, key)) for r in ranks]
            for r in ranks:
                assert table.groups[table.name(r, key)] == mesh.group_members(key, r)
        inside = [r for r in ranks if mesh.coord(r, "pp") < 3]
        assert mesh.peer_array("pp+1", np.array(inside)).tolist() == [mesh.peer(r, "pp+1") for r in inside]
        with pytest.raises(ValueError, match="no pp neighbour at offset 1"):
            mesh.peer_array("pp+1", ranks)


def test_group_table_by_hand():
    # tp2 dp2 pp2, default order: rank = tp + 2 dp + 4 pp
    table = GroupTable(Mesh({"tp": 2, "dp": 2, "pp": 2}), ["dp", "tp", "pp@0,1"])
    assert table.groups == {
        "1": [0, 1], "2": [2, 3], "3": [4, 5], "4": [6, 7],  # tp, by (dp, pp)
        "5": [0, 2], "6": [1, 3], "7": [4, 6], "8": [5, 7],  # dp, by (tp, pp)
        "9": [0, 4], "10": [1, 5], "11": [2, 6], "12": [3, 7],  # first and last stage
    }


def test_ring_peers_wrap_around_the_axis():
    # tp2 cp4 dp2, order tp-cp-ep-dp-pp: rank = tp + 2 cp + 8 dp
    mesh = Mesh({"tp": 2, "cp": 4, "dp": 2}, "tp-cp-ep-dp-pp")
    for r in range(16):
        tp, cp, dp = r % 2, (r // 2) % 4, r // 8
        assert mesh.peer(r, "cp%+1") == tp + 2 * ((cp + 1) % 4) + 8 * dp
        assert mesh.peer(r, "cp%-1") == tp + 2 * ((cp - 1) % 4) + 8 * dp
    assert mesh.peer(6, "cp%+1") == 0 and mesh.peer(0, "cp%-1") == 6
    with pytest.raises(ValueError):
        mesh.peer(6, "cp+1")  # without % the axis ends
    import numpy as np

    assert mesh.peer_array("cp%-1", np.arange(16)).tolist() == [mesh.peer(r, "cp%-1") for r in range(16)]


# --------------------------------------------------------------------------- expert view (issue 10, point 4)


def _partition(mesh, key):
    return sorted({tuple(mesh.group_members(key, r)) for r in range(mesh.world_size)})


def test_sixteen_ranks_default_order_hand_worked():
    # tp2 cp2 dp2 pp2, ep2 carved out of dp x cp, "tp-cp-ep-dp-pp" (Megatron's default).
    # Decoder view: tp stride 1, cp stride 2, dp stride 4, pp stride 8.
    # Expert view (Megatron's expert RankGenerator: the same order without cp, tp read as
    # etp = 2, dp as edp = 2*2*2 / (2*2) = 2): etp stride 1, ep stride 2, edp stride 4, pp 8.
    mesh = Mesh.from_plan(Plan(tp=2, cp=2, dp=2, pp=2, ep=2))
    assert mesh.world_size == 16
    assert _partition(mesh, "tp") == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]
    assert _partition(mesh, "cp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert _partition(mesh, "dp") == [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]
    assert _partition(mesh, "pp") == [(i, i + 8) for i in range(8)]
    assert _partition(mesh, "cp+dp") == [(0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15)]
    assert _partition(mesh, "etp") == _partition(mesh, "tp")
    assert _partition(mesh, "ep") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert _partition(mesh, "edp") == [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]
    # rank 13: tp 1, cp 0, dp 1, pp 1; expert coordinates etp 1, ep 0, edp 1, pp 1
    assert mesh.coords(13) == {"tp": 1, "cp": 0, "dp": 1, "pp": 1}
    assert mesh.expert_coords(13) == {"etp": 1, "ep": 0, "edp": 1, "pp": 1}
    # ep is carved out of dp x cp: every ep group (and ep x edp) lies in one cp+dp group
    for r in range(16):
        assert set(mesh.group_members("ep", r)) <= set(mesh.group_members("cp+dp", r))
        assert mesh.group_members("ep+edp", r) == mesh.group_members("cp+dp", r)
    # in this order the ep groups are the cp groups: no new process groups
    assert mesh.canonical("ep") == "cp" and mesh.canonical("edp") == "dp" and mesh.canonical("etp") == "tp"


def test_sixteen_ranks_another_order_hand_worked():
    # "tp-ep-dp-cp-pp": decoder view tp 1, dp 2, cp 4, pp 8; expert view (cp left out):
    # etp 1, ep 2, edp 4, pp 8 -- now ep pairs the dp neighbours and edp the cp ones
    mesh = Mesh.from_plan(Plan(tp=2, cp=2, dp=2, pp=2, ep=2, order="tp-ep-dp-cp-pp"))
    assert _partition(mesh, "dp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert _partition(mesh, "cp") == [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]
    assert _partition(mesh, "ep") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert _partition(mesh, "edp") == [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)]
    assert mesh.coords(13) == {"tp": 1, "dp": 0, "cp": 1, "pp": 1}
    assert mesh.expert_coords(13) == {"etp": 1, "ep": 0, "edp": 1, "pp": 1}
    assert mesh.canonical("ep") == "dp" and mesh.canonical("edp") == "cp"
    for r in range(16):
        assert mesh.group_members("ep+edp", r) == mesh.group_members("cp+dp", r)


def test_expert_tensor_parallel_below_tp_takes_ep_from_the_tp_ranks():
    # etp 1 with tp 2, ep 4, dp 2 (8 ranks): the expert view is ep stride 1, edp stride 4,
    # so each ep group spans a TP pair and its dp neighbours (Megatron requires SP here)
    mesh = Mesh.from_plan(Plan(tp=2, dp=4, ep=4, etp=1))
    assert _partition(mesh, "ep") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert _partition(mesh, "edp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.canonical("ep") == "ep"  # a group of its own: tp+dp would be all 8 ranks
    table = GroupTable(mesh, ["tp", "ep", "edp"])
    assert sorted(map(tuple, table.groups.values())) == sorted(
        _partition(mesh, "tp") + _partition(mesh, "ep") + _partition(mesh, "edp"))
