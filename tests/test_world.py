"""Representative ranks: ``gpumem simulate --nnodes N --nproc-per-node G
--ranks LIST|auto`` (gpumem/sim/world.py, gpumem/sim/world_rank.py).

Fast tests (no torch): the rank list, which ranks each row stands for, each
rank's torchrun variables, the launcher command, and the refusals (one line,
nothing run).  The exactness of a subset against the full run is in
tests/sim/test_world_exact.py (slow tier).
"""

from __future__ import annotations

import sys

import pytest

from gpumem.sim import command as simulate, world as _world


def test_ranks_lists_ranges_and_auto():
    assert _world.parse_ranks("0,8,63", 64) == [0, 8, 63]
    assert _world.parse_ranks(" 7 , 0-2 ,1", 8) == [0, 1, 2, 7]
    assert _world.parse_ranks("auto", 1024) == [0, 1023]
    assert _world.parse_ranks("AUTO", 1) == [0]
    assert _world.parse_ranks("1023", 1024) == [1023]


@pytest.mark.parametrize("text", ["", "a", "1,,2", "3-1", "-1", "8", "0-8", "1.5"])
def test_bad_ranks_are_refused(text):
    with pytest.raises(_world.WorldError) as e:
        _world.parse_ranks(text, 8)
    assert "\n" not in str(e.value) and "nothing was run" in str(e.value)


def test_too_many_started_ranks_are_refused():
    with pytest.raises(_world.WorldError, match="at most 64 are started"):
        _world.parse_ranks("0-64", 1024)


def test_rows_stand_for_themselves_or_for_the_data_parallel_ranks():
    listed = _world.stands_for([0, 8, 63], 64, auto=False)
    assert listed == {r: {"ranks": str(r), "count": 1, "why": "user list"} for r in (0, 8, 63)}
    auto = _world.stands_for([0, 63], 64, auto=True)
    assert auto[0]["ranks"] == "0-62" and auto[0]["count"] == 63
    assert auto[63]["ranks"] == "63" and auto[63]["count"] == 1
    assert sum(v["count"] for v in auto.values()) == 64
    assert _world.stands_for([0], 1, auto=True) == {0: {"ranks": "0", "count": 1,
                                                        "why": auto[0]["why"]}}
    assert _world.ranks_text([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_auto_names_the_ranks_a_context_or_pipeline_dimension_needs():
    # (dp 2, cp 2, tp 2), row-major: cp index 1 starts at rank 2; auto started 0 and 7
    said = _world.auto_advice([{"names": ["dp", "cp", "tp"], "shape": [2, 2, 2]}], 8, [0, 7])
    assert said.endswith("run with --ranks 0,2,7") and "cp dimension of 2" in said
    assert _world.parse_ranks(said.rsplit(" ", 1)[1], 8) == [0, 2, 7]
    said = _world.auto_advice([{"names": ["pp", "dp"], "shape": [4, 2]}], 8, [0, 7])
    assert said.endswith("--ranks 0,2,4,6-7")
    # data and tensor parallel alone: auto's two ranks cover the job; a mesh over
    # part of the world (a sub-mesh) or without names says nothing
    assert _world.auto_advice([{"names": ["dp", "tp"], "shape": [16, 8]}], 128, [0, 127]) is None
    assert _world.auto_advice([{"names": ["cp"], "shape": [2]}], 8, [0, 7]) is None
    assert _world.auto_advice([{"names": [], "shape": [8]}], 8, [0, 7]) is None


def test_each_rank_sees_its_place_in_the_full_job():
    env = _world.rank_env(63, nnodes=8, nproc=8)
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"], env["WORLD_SIZE"],
            env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == ("63", "7", "7", "64", "8", "8")
    env = _world.rank_env(1000, nnodes=128, nproc=8)
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == ("1000", "0", "125")


def test_launch_command_starts_the_world_launcher():
    head = [sys.executable, "-m", "gpumem.sim.world", "--nnodes", "8", "--nproc-per-node", "8",
            "--ranks", "0,63", "--"]
    assert _world.launch_command(["python", "t.py", "a"], 8, 8, [0, 63]) == head + ["t.py", "a"]
    assert _world.launch_command(["-m", "pkg.t"], 8, 8, [0, 63]) == head + ["-m", "pkg.t"]
    with pytest.raises(_world.WorldError, match="not a torchrun command"):
        _world.launch_command(["torchrun", "--nproc-per-node", "8", "t.py"], 8, 8, [0])


@pytest.mark.parametrize("args, words", [
    (["--ranks", "0"], "need --nproc-per-node"),
    (["--nnodes", "2"], "need --nproc-per-node"),
    (["--nnodes", "0", "--nproc-per-node", "8"], "--nnodes must be"),
    (["--nnodes", "8", "--nproc-per-node", "8", "--ranks", "64"], "ranks 0 to 63"),
    (["--nnodes", "16", "--nproc-per-node", "8"], "at most 64 are started"),
    (["--nnodes", "9000", "--nproc-per-node", "8", "--ranks", "0"], "at most 65536"),
])
def test_bad_world_is_one_line_and_runs_nothing(tmp_path, capsys, args, words):
    marker = tmp_path / "ran"
    script = tmp_path / "t.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    rc = simulate.main(["--out", str(tmp_path / "out"), *args, "--", str(script)])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0], (rc, err)
    assert not marker.exists() and not (tmp_path / "out").exists()
