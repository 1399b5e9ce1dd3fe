"""The batched benchmark's two stocks (benchmarks/system_bench.py): stock as configured by default (its drafter's
16-chain) and stock tuned to its best static block per batch size, each block with its own drafter pass and its own
lattices (a drafter run over a smaller block drafts differently: the truncated 16-block is not that run)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from specpilot_mem.replay.lattice import LatticeRecorder  # noqa: E402

OUTPUT = list(range(100, 140))


def chain_lattice(tmp_path, block: int, right: int):
    """Lattices of one request at every position: the drafter's first choice is the greedy token for the first
    ``right`` drafted positions of each step and wrong after them."""
    rec = LatticeRecorder(tmp_path / f"block{block}-{right}.npz", kind="selector", positions=block, candidates=4)
    for i in range(len(OUTPUT)):
        cand = np.zeros((block, 4), np.int64)
        for s in range(block):
            truth = OUTPUT[i + s] if i + s < len(OUTPUT) else 1
            cand[s] = [truth if s < right else 7, 3, 4, 5]
        unary = np.tile(np.array([0.0, -5.0, -6.0, -7.0]), (block, 1))
        pair = np.repeat(unary[:, None, :], 4, axis=1)
        rec.add("r0", i, cand, unary, pair)
    rec.set_greedy("r0", OUTPUT, label="test")
    return rec.close()


def test_stock_tuned_takes_each_blocks_own_lattice_and_draft_time(tmp_path):
    import system_bench as bench

    block_lattices = {2: chain_lattice(tmp_path, 2, right=2), 4: chain_lattice(tmp_path, 4, right=0)}
    entry = {"T_AR_ms": 1.0, "T_draft_by_block_ms": {"2": 0.2, "4": 0.1, "8": 0.1}}
    steps = {"3": 1.0, "5": 1.0, "9": 1.0}  # block 8: timed, but no lattice recorded at that block -> not a choice
    tuned = bench.stock_tuned(entry, steps, block_lattices)
    assert set(tuned["by_block"]) == {"2", "4"}
    two, four = tuned["by_block"]["2"], tuned["by_block"]["4"]
    assert four["tau"] == 1.0  # nothing accepted: one token a step
    assert two["tau"] > 2.5 and two["c"] == 1.2 and four["c"] == 1.1
    assert (tuned["block"], tuned["rows"]) == (2, 3)
    assert tuned["speedup_over_ar"] == two["S"] == round(two["tau"] / 1.2, 4)


def test_stock_tuned_needs_a_timed_block():
    import system_bench as bench

    assert bench.stock_tuned({"T_AR_ms": 1.0}, {"17": 2.0}, {16: None}) is None


def test_batched_speedup_reports_both_stocks_and_the_gains_over_each(tmp_path):
    import system_bench as bench

    sixteen = chain_lattice(tmp_path, 16, right=3)
    blocks = {2: chain_lattice(tmp_path, 2, right=2), 4: chain_lattice(tmp_path, 4, right=3), 16: sixteen}
    steps = {"3": 1.2, "5": 1.4, "17": 3.0}
    run = {
        "by_batch": {
            "8": {
                "T_AR_ms": 1.0,
                "T_draft_ms": 0.5,
                "T_draft_tree_ms": 0.6,
                "T_draft_by_block_ms": {"2": 0.2, "4": 0.25, "16": 0.5},
                "T_verify_stock_ms": steps,
                "T_verify_specpilot_ms": steps,
            }
        }
    }
    row = bench.batched_speedup(run, sixteen, blocks)["8"]
    stock, tuned = row["stock"], row["stock_tuned"]
    assert stock["rows"] == 17 and stock["speedup_over_ar"] == stock["by_rows"]["17"]["S"]  # the default, kept
    assert stock["by_rows"]["17"]["c"] == 3.5  # its draft at the 16-block (argmax a position)
    assert row["specpilot"]["by_rows"]["17"]["c"] == 3.6  # the trees' draft (top-8 a position)
    assert tuned["speedup_over_ar"] == max(b["S"] for b in tuned["by_block"].values())
    assert tuned["by_block"]["16"]["S"] == stock["speedup_over_ar"]  # the default block is one of the choices
    mine = row["specpilot"]["speedup_over_ar"]
    assert row["gain_over_stock"] == round(mine / stock["speedup_over_ar"], 4)
    assert row["gain_over_stock_tuned"] == round(mine / tuned["speedup_over_ar"], 4)


def test_static_stock_is_one_block_for_every_batch_size_and_trees_draft_the_block_they_reach(tmp_path):
    """Block 2 is the best at 8 requests, block 4 at 32; one launch serves both, so the static stock takes the
    block with the better worst case (4 here) at both. SpecPilot's 4-node bucket drafts block 4 (its own pass and
    lattices), its 16-node bucket block 16."""
    import system_bench as bench

    sixteen = chain_lattice(tmp_path, 16, right=3)
    blocks = {2: chain_lattice(tmp_path, 2, right=2), 4: chain_lattice(tmp_path, 4, right=3), 16: sixteen}

    def entry(verify):
        return {
            "T_AR_ms": 1.0,
            "T_draft_ms": 0.5,
            "T_draft_tree_ms": 0.6,
            "T_draft_by_block_ms": {"2": 0.2, "4": 0.25, "16": 0.5},
            "T_draft_tree_by_block_ms": {"2": 0.3, "4": 0.35, "16": 0.6},
            "T_verify_stock_ms": verify,
            "T_verify_specpilot_ms": verify,
        }

    run = {"by_batch": {"8": entry({"3": 1.0, "5": 2.0, "17": 3.0}), "32": entry({"3": 3.0, "5": 2.0, "17": 6.0})}}
    table = bench.batched_speedup(run, sixteen, blocks)
    assert table["8"]["stock_tuned"]["block"] == 2 and table["32"]["stock_tuned"]["block"] == 4
    for B, row in table.items():
        static = row["stock_static"]
        assert static["block"] == 4 and static["speedup_over_ar"] == row["stock_tuned"]["by_block"]["4"]["S"]
        assert static["worst_over_batches"] == min(r["stock_tuned"]["by_block"]["4"]["S"] for r in table.values())
        mine = row["specpilot"]
        assert mine["by_rows"]["5"]["drafter_block"] == 4 and mine["by_rows"]["17"]["drafter_block"] == 16
        assert mine["by_rows"]["5"]["c"] == round(0.35 + float(run["by_batch"][B]["T_verify_specpilot_ms"]["5"]), 4)
        assert mine["by_rows"]["5"]["tau"] == bench.replay_tau(blocks[4], "best-first", 4)
        if mine["rows"] > 1:
            assert row["gain_over_stock_static"] == round(mine["speedup_over_ar"] / static["speedup_over_ar"], 4)
