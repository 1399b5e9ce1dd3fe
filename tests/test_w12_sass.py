"""The SASS loop counter behind the W12 notes' instruction counts (benchmarks/w12_sass.py)."""

import json
import shutil

import pytest

from benchmarks import w12_sass


# a main loop from 0x0040 to the backward branch at 0x00f0, with an escape check whose patch (0x00a0-0x00c0)
# is branched over when no lane holds an escape
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0040*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0050*/                   LOP3.LUT R8, R4, 0x7ff07ff0, RZ, 0xc0, !PT ;
        /*0060*/                   ISETP.NE.AND P0, PT, R9, R10, PT ;
        /*0070*/                   VOTE.ANY R11, PT, !P0 ;
        /*0080*/              @!P0 BRA 0xd0 ;
        /*0090*/                   SHFL.IDX PT, R12, R13, R14, 0x1f ;
        /*00a0*/                   SHFL.IDX PT, R15, R13, R14, 0x1f ;
        /*00c0*/                   BRA 0x90 ;
        /*00d0*/                   HMMA.16816.F32.BF16 R16, R4, R20, R16 ;
        /*00e0*/                   ISETP.GE.AND P1, PT, R22, R23, PT ;
        /*00f0*/              @!P1 BRA 0x40 ;
        /*0100*/                   EXIT ;
"""


def test_loop_counts_one_pass_without_the_escape_patch():
    ops = w12_sass.loop_instructions(SASS)
    assert ops == [
        "LDG.E.128",
        "LOP3.LUT",
        "ISETP.NE.AND",
        "VOTE.ANY",
        "BRA",
        "HMMA.16816.F32.BF16",
        "ISETP.GE.AND",
        "BRA",
    ]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA 12.8+)")
def test_every_kernel_instantiation_is_counted(tmp_path, capsys):
    out = tmp_path / "sass.json"
    assert w12_sass.main(["--out", str(out)]) == 0
    kernels = {k["kernel"]: k for k in json.loads(out.read_text())["kernels"]}
    # 12 (token tiles, plan) pairs (2 of them staged weights; 3 token tiles for 17-24 rows in every 17-32-row plan), 9
    # of one tile a warp also reducing K splits in a cluster: 21 kernels exact and 17 (never staged) for each of the Q
    # pass's 2 low-bit modes; the shared-activation kernel (exact only): 3 or 4 token tiles x 2 step sizes x cluster
    # or not
    assert len([k for k in kernels if "<" == k[0]]) == 21 + 2 * 17
    assert len([k for k in kernels if k.startswith("shared_x")]) == 8
    # the warpgroup kernel (exact only): 3 token-tile counts (9-64 rows) x cluster or not x weights in registers
    # or staged through shared memory
    assert len([k for k in kernels if k.startswith("wgmma")]) == 12
    # the Q pass: one permute a register as the exact decode, no nibble loads (4 view loads a chunk, not 4 + 4)
    q_row = kernels["<1, 2, 4, 1, 0, 0>"]
    assert q_row["by_opcode"]["PRMT"] == 32 and q_row["by_opcode"]["HMMA"] == 8
    assert q_row["by_opcode"]["LDG"] == kernels["<1, 0, 4, 1, 0, 0>"]["by_opcode"]["LDG"] - 4
    one_row = kernels["<1, 0, 4, 1, 0, 0>"]
    assert one_row["chunks_per_iteration"] == 1.0 and one_row["by_opcode"]["HMMA"] == 8
    assert one_row["by_opcode"]["PRMT"] == 32  # one byte permute per pair of weights: 64 weights a lane a chunk
    staged = kernels["<1, 0, 4, 1, 1, 0>"]  # the next chunk copied to shared memory (LDGSTS), read back with LDS
    assert staged["by_opcode"]["LDGSTS"] >= 4 and staged["by_opcode"]["LDS"] >= 8
    assert staged["by_opcode"]["LDG"] == one_row["by_opcode"]["LDG"] - 8  # 4 view and 4 nibble loads a chunk fewer
    assert staged["registers"] < one_row["registers"]  # the point of staging: fewer registers, more resident warps
    # 32 rows in whole steps: 16 activation loads a chunk come from the block's ring (LDS), not global memory
    own, shared = kernels["<4, 0, 4, 1, 0, 0>"], kernels["shared_x <4, 0, 4, 0>"]
    assert shared["chunks_per_iteration"] == 1.0 and shared["by_opcode"]["HMMA"] == 32
    # (the loop counted includes the escape overlay's path: its 16-byte stores and loads are the same in every kernel)
    assert shared["by_opcode"]["LDS"] == own["by_opcode"]["LDS"] + 16
    # (+1: the ring kernel loads an escape-heavy chunk's second round of escapes before patching the first)
    assert shared["by_opcode"]["LDG"] == own["by_opcode"]["LDG"] - 16 + 1
    assert shared["registers"] < own["registers"]  # one block's activations held at a time, not a whole step's
    # warpgroup MMAs at 32 rows: 8 wgmma a chunk for 4 tiles; a chunk's activations arrive by one bulk copy (the
    # class's copier) into shared memory, so no thread loads or holds them (its only shared stores are the escape
    # overlay's): the only global loads left are the next chunk's weights (4 view and 4 nibble pieces) and escapes'
    warpgroup = kernels["wgmma <4, 0, 0, 0>"]
    assert warpgroup["chunks_per_iteration"] == 1.0 and warpgroup["by_opcode"]["HGMMA"] == 8
    assert (
        warpgroup["by_opcode"]["UBLKCP"] == 1 and warpgroup["by_opcode"]["STS"] == own["by_opcode"]["STS"] + 4
    )  # + the batched escape patch's round trip
    assert "HMMA" not in warpgroup["by_opcode"]
    assert warpgroup["registers"] < own["registers"]
    # with staged weights a warp copies each chunk into its ring (4 view and 2 nibble-run pieces a lane, LDGSTS) and
    # reads it back (LDS): the escapes' loads are the only global loads left, and registers are free
    staged_wg = kernels["wgmma <4, 0, 0, 1>"]
    assert staged_wg["by_opcode"]["HGMMA"] == 8 and staged_wg["by_opcode"]["LDGSTS"] == 6
    assert staged_wg["by_opcode"]["LDG"] == warpgroup["by_opcode"]["LDG"] - 8 and staged_wg["by_opcode"]["LDS"] >= 8
    assert staged_wg["registers"] < warpgroup["registers"]
