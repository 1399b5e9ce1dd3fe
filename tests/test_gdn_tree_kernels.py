"""GDN tree verification kernels against the pure-torch definition (Triton interpreter on CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from specpilot_kernels.gdn_tree import gdn_tree_commit, gdn_tree_path_verify, tree_schedule
from specpilot_kernels.gdn_tree import reference as R


def _random_tree(gen, n, chain_bias=0.5):
    """Parents of a random tree in topological order; root has parent -1."""
    parents = [-1]
    for i in range(1, n):
        if torch.rand((), generator=gen) < chain_bias:
            parents.append(i - 1)
        else:
            parents.append(int(torch.randint(-1, i, (), generator=gen)))
    return parents


def _inputs(gen, B, T, H, HV, K, V, dtype=torch.bfloat16, slots=6):
    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(dtype)

    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V)
    a, b = r(B, T, HV), r(B, T, HV)
    A_log, dt_bias = torch.randn(HV, generator=gen) * 0.5, torch.randn(HV, generator=gen) * 0.5
    pool = torch.randn(slots, HV, V, K, generator=gen) * 0.3
    slots_used = torch.randperm(slots, generator=gen)[:B]
    return q, k, v, a, b, A_log, dt_bias, pool, slots_used


def _root_path_padded(parents, node, T):
    path = R.root_path(parents, node)
    return path + [0] * (T - len(path)), len(path)


@pytest.mark.parametrize("max_saved", [0, 2, 8])
def test_schedule_visits_every_node_once_and_starts_from_its_parents_state(max_saved):
    """Simulate the schedule on root paths: every node starts from exactly its parent's root path."""
    gen = torch.Generator().manual_seed(1)
    T = 24
    parents = torch.tensor([_random_tree(gen, T, 0.3) for _ in range(3)])
    num_nodes = torch.tensor([24, 17, 1])
    s = tree_schedule(parents, num_nodes, max_saved=max_saved)
    for r in range(3):
        n = int(num_nodes[r])
        order = s.order[r, :n].tolist()
        assert sorted(order) == list(range(n))
        path, kept = [], {}  # the state as the nodes applied to the committed state; kept slots
        for j, node in enumerate(order):
            p = int(parents[r, node])
            n_replay = int(s.replay_len[r, j])
            if n_replay >= 0:
                slot = int(s.restore_slot[r, j])
                path = (list(kept[slot]) if slot >= 0 else []) + s.replay[r, j, :n_replay].tolist()
            assert path == (R.root_path(parents[r].tolist(), p) if p >= 0 else [])
            path = path + [node]
            slot = int(s.save_slot[r, j])
            if slot >= 0:
                assert slot < max_saved
                kept[slot] = path
        if max_saved == 0:
            assert (s.save_slot[r] == -1).all()


def test_kept_branch_states_remove_every_replay():
    """With enough slots each node costs one step: restarts restore their parent's kept state."""
    gen = torch.Generator().manual_seed(4)
    parents = torch.tensor([_random_tree(gen, 32, 0.4) for _ in range(4)])
    assert (tree_schedule(parents, max_saved=32).replayed_steps() == 32).all()
    assert (tree_schedule(parents, max_saved=0).replayed_steps() > 32).all()


def test_schedule_of_a_chain_never_replays():
    s = tree_schedule(torch.tensor([[-1] + list(range(15))]))
    assert s.order[0].tolist() == list(range(16))
    assert (s.replay_len[0] == -1).all()
    assert int(s.replayed_steps()[0]) == 16


@pytest.mark.parametrize(
    "T,chain_bias,max_saved,prefetch", [(8, 0.5, 8, True), (16, 0.2, 2, True), (16, 0.2, 0, False), (12, 1.0, 8, True)]
)
def test_path_verify_matches_reference(T, chain_bias, max_saved, prefetch):
    gen = torch.Generator().manual_seed(T)
    B, H, HV, K, V = 2, 2, 4, 32, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V)
    parents = torch.tensor([_random_tree(gen, T, chain_bias) for _ in range(B)])
    num_nodes = torch.tensor([T, T - 3])
    o = gdn_tree_path_verify(
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        pool,
        idx,
        tree_schedule(parents, num_nodes, max_saved=max_saved),
        block_v=8,
        num_warps=1,
        prefetch=prefetch,
    )
    ref = R.path_verify_reference(q, k, v, a, b, A_log, dt_bias, pool, idx, parents, num_nodes)
    assert o.dtype == torch.bfloat16
    torch.testing.assert_close(o.float(), ref.float(), atol=2e-2, rtol=1e-2)
    assert (o[1, T - 3 :] == 0).all()


def test_path_verify_fp32_is_tight_and_state_untouched():
    gen = torch.Generator().manual_seed(5)
    B, T, H, HV, K, V = 1, 10, 1, 2, 16, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V, dtype=torch.float32)
    parents = torch.tensor([_random_tree(gen, T, 0.4)])
    before = pool.clone()
    o = gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, tree_schedule(parents), block_v=16)
    ref = R.path_verify_reference(q, k, v, a, b, A_log, dt_bias, pool, idx, parents, torch.tensor([T]))
    torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(pool, before)


@pytest.mark.parametrize(
    "pool_dtype,prefetch", [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)]
)
def test_commit_replays_the_accepted_path(pool_dtype, prefetch):
    gen = torch.Generator().manual_seed(7)
    B, T, H, HV, K, V = 3, 8, 2, 4, 16, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V)
    pool = pool.to(pool_dtype)
    parents = [_random_tree(gen, T, 0.5) for _ in range(B)]
    rows = [_root_path_padded(parents[0], 7, T), _root_path_padded(parents[1], 3, T), ([0] * T, 0)]
    accepted = torch.tensor([r[0] for r in rows])
    accept_len = torch.tensor([r[1] for r in rows])
    want = R.commit_reference(k, v, a, b, A_log, dt_bias, pool, idx, accepted, accept_len)
    got = pool.clone()
    gdn_tree_commit(q, k, v, a, b, A_log, dt_bias, got, idx, accepted, accept_len, block_v=8, prefetch=prefetch)
    tol = dict(atol=1e-5, rtol=1e-5) if pool_dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    untouched = [s for s in range(pool.shape[0]) if s not in idx[:2].tolist()]
    assert torch.equal(got[untouched], pool[untouched])  # rejected request and unused slots unchanged


def test_kept_branch_states_give_the_same_bits_as_replaying():
    gen = torch.Generator().manual_seed(6)
    B, T, H, HV, K, V = 2, 14, 1, 2, 16, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V, dtype=torch.float32)
    parents = torch.tensor([_random_tree(gen, T, 0.3) for _ in range(B)])
    outs = [
        gdn_tree_path_verify(
            q, k, v, a, b, A_log, dt_bias, pool, idx, tree_schedule(parents, max_saved=m), block_v=16, prefetch=m > 0
        )
        for m in (0, 1, 8)
    ]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_commit_after_path_verify_continues_the_recurrence():
    """Committing node p then verifying its child from the new state equals verifying the child directly."""
    gen = torch.Generator().manual_seed(11)
    B, T, H, HV, K, V = 1, 6, 1, 2, 16, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V, dtype=torch.float32)
    chain = torch.tensor([[-1, 0, 1, 2, 3, 4]])
    o_full = gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, tree_schedule(chain), block_v=16)
    committed = pool.clone()
    gdn_tree_commit(
        q, k, v, a, b, A_log, dt_bias, committed, idx, torch.tensor([[0, 1, 2, 0, 0, 0]]), torch.tensor([3]), block_v=16
    )
    shifted = [t[:, 3:].contiguous() for t in (q, k, v, a, b)]
    o_rest = gdn_tree_path_verify(*shifted, A_log, dt_bias, committed, idx, tree_schedule(chain[:, :3]), block_v=16)
    torch.testing.assert_close(o_rest, o_full[:, 3:], atol=1e-6, rtol=1e-6)


def test_wy_identity_equals_recurrence():
    gen = torch.Generator().manual_seed(3)
    B, T, H, HV, K, V = 2, 12, 1, 2, 16, 8
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V, dtype=torch.float32)
    parents = torch.tensor([_random_tree(gen, T, 0.4) for _ in range(B)])
    nn = torch.tensor([12, 9])
    rec = R.path_verify_reference(q, k, v, a, b, A_log, dt_bias, pool, idx, parents, nn)
    wy = R.wy_verify_reference(q, k, v, a, b, A_log, dt_bias, pool, idx, parents, nn)
    torch.testing.assert_close(wy, rec, atol=1e-5, rtol=1e-5)


def test_bad_shapes_are_rejected():
    gen = torch.Generator().manual_seed(0)
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, 1, 4, 1, 2, 16, 16)
    with pytest.raises(ValueError, match="state_pool"):
        gdn_tree_path_verify(
            q, k, v, a, b, A_log, dt_bias, pool[:, :1].contiguous(), idx, tree_schedule(torch.tensor([[-1, 0, 1, 2]]))
        )
    with pytest.raises(ValueError, match="64 nodes"):
        tree_schedule(torch.full((1, 65), -1))


@pytest.mark.parametrize("T", [8, 20])
def test_wy_verify_matches_path_verify(T):
    from specpilot_kernels.gdn_tree import gdn_tree_wy_verify, tree_ancestors

    gen = torch.Generator().manual_seed(100 + T)
    B, H, HV, K, V = 2, 2, 4, 32, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V)
    parents = torch.tensor([_random_tree(gen, T, 0.4) for _ in range(B)])
    num_nodes = torch.tensor([T, T - 5])
    wy = gdn_tree_wy_verify(
        q, k, v, a, b, A_log, dt_bias, pool, idx, tree_ancestors(parents, num_nodes), num_nodes, block_v=16, num_warps=4
    )
    path = gdn_tree_path_verify(
        q, k, v, a, b, A_log, dt_bias, pool, idx, tree_schedule(parents, num_nodes), block_v=16
    ).double()
    ulp = torch.ldexp(torch.ones_like(path), torch.frexp(path.abs().clamp_min(1e-30))[1] - 8)
    # within one bf16 ulp of the path kernel (plus FP32-level slack where outputs cancel to near zero)
    assert ((wy.double() - path).abs() <= ulp + 1e-6 * path.abs().max()).all()
    assert (wy[1, T - 5 :] == 0).all()


def test_tree_ancestors_is_the_root_path_mask():
    gen = torch.Generator().manual_seed(9)
    from specpilot_kernels.gdn_tree import tree_ancestors

    parents = torch.tensor([_random_tree(gen, 40, 0.3) for _ in range(2)])
    anc = tree_ancestors(parents)
    for r in range(2):
        assert torch.equal(anc[r].bool(), R.ancestor_mask(parents[r]))


@pytest.mark.parametrize("max_saved,prefetch", [(8, True), (2, False)])
def test_prepared_inputs_give_the_same_bits(max_saved, prefetch):
    """q/k normalised and gates formed once per token (first kernel) or in every tile: the same outputs."""
    gen = torch.Generator().manual_seed(21)
    B, T, H, HV, K, V = 2, 12, 2, 4, 32, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V)
    parents = torch.tensor([_random_tree(gen, T, 0.3) for _ in range(B)])
    schedule = tree_schedule(parents, torch.tensor([T, T - 2]), max_saved=max_saved)
    outs = [
        gdn_tree_path_verify(
            q, k, v, a, b, A_log, dt_bias, pool, idx, schedule, block_v=8, prefetch=prefetch, prepare_inputs=prepared
        )
        for prepared in (False, True)
    ]
    assert torch.equal(outs[0], outs[1])


def test_prepare_node_inputs_matches_reference():
    from specpilot_kernels.gdn_tree.path_verify import prepare_node_inputs

    gen = torch.Generator().manual_seed(22)
    B, T, H, HV, K, V = 2, 5, 2, 4, 32, 16
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, B, T, H, HV, K, V)
    q_n, k_n, decay, beta = prepare_node_inputs(q, k, a, b, A_log, dt_bias, scale=0.25)
    g, beta_ref = R.gdn_gates(A_log, a, dt_bias, b)
    unit = lambda x: x.float() * torch.rsqrt((x.float() ** 2).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    torch.testing.assert_close(q_n, unit(q) * 0.25, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(k_n, unit(k), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(decay, torch.exp(g), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(beta, beta_ref, atol=1e-6, rtol=1e-5)


def test_lanes_kernel_refuses_inputs_it_does_not_take():
    gen = torch.Generator().manual_seed(23)
    q, k, v, a, b, A_log, dt_bias, pool, idx = _inputs(gen, 1, 4, 1, 2, 16, 16)
    with pytest.raises(ValueError, match="CUDA kernel"):
        gdn_tree_path_verify(
            q, k, v, a, b, A_log, dt_bias, pool, idx, tree_schedule(torch.tensor([[-1, 0, 1, 2]])), lanes_per_column=8
        )


@pytest.mark.gpu
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_saved", [8, 2, 0])
def test_lanes_kernel_gives_the_triton_kernels_bits(pool_dtype, max_saved):
    """The CUDA step loop (lanes along V) against the Triton kernel, with restarts that restore and replay."""
    gen = torch.Generator().manual_seed(24 + max_saved)
    B, T, H, HV, K, V = 3, 24, 2, 4, 128, 128
    q, k, v, a, b, A_log, dt_bias, pool, idx = (t.cuda() for t in _inputs(gen, B, T, H, HV, K, V))
    pool = pool.to(pool_dtype)
    parents = torch.tensor([_random_tree(gen, T, 0.3) for _ in range(B)]).cuda()
    schedule = tree_schedule(parents, torch.tensor([T, T - 5, 1]).cuda(), max_saved=max_saved)
    want = gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, schedule, lanes_per_column=None)
    for lanes, warps in ((4, 4), (8, 8), (16, 2), (32, 1)):
        if pool_dtype == torch.bfloat16 and lanes == 32:
            continue  # a bf16 pool's sums run over 16 runs of 8 elements
        got = gdn_tree_path_verify(
            q, k, v, a, b, A_log, dt_bias, pool, idx, schedule, lanes_per_column=lanes, warps_per_block=warps
        )
        assert torch.equal(got, want), (lanes, (got.float() - want.float()).abs().max().item())


@pytest.mark.gpu
def test_lanes_kernel_on_64_node_trees():
    """64 nodes stage 64 KB of rows per block (over the default 48 KB of shared memory)."""
    gen = torch.Generator().manual_seed(25)
    B, T, H, HV, K, V = 2, 64, 2, 4, 128, 128
    q, k, v, a, b, A_log, dt_bias, pool, idx = (t.cuda() for t in _inputs(gen, B, T, H, HV, K, V))
    parents = torch.tensor([_random_tree(gen, T, 0.5) for _ in range(B)]).cuda()
    schedule = tree_schedule(parents, max_saved=8)
    want = gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, schedule, lanes_per_column=None)
    got = gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, schedule)  # the default: CUDA on a GPU
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_lanes_commit_gives_the_triton_commits_bits(pool_dtype):
    gen = torch.Generator().manual_seed(31)
    B, T, H, HV, K, V = 3, 16, 2, 4, 128, 128
    q, k, v, a, b, A_log, dt_bias, pool, idx = (t.cuda() for t in _inputs(gen, B, T, H, HV, K, V))
    pool = pool.to(pool_dtype)
    parents = [_random_tree(gen, T, 0.5) for _ in range(B)]
    rows = [_root_path_padded(parents[0], T - 1, T), _root_path_padded(parents[1], 5, T), ([0] * T, 0)]
    accepted, accept_len = torch.tensor([r[0] for r in rows]).cuda(), torch.tensor([r[1] for r in rows]).cuda()
    want = pool.clone()
    gdn_tree_commit(q, k, v, a, b, A_log, dt_bias, want, idx, accepted, accept_len, lanes_per_column=None)
    for lanes in (4, 8, 16, 32):
        if pool_dtype == torch.bfloat16 and lanes == 32:
            continue  # a bf16 pool's sums run over 16 runs of 8 elements
        got = pool.clone()
        gdn_tree_commit(q, k, v, a, b, A_log, dt_bias, got, idx, accepted, accept_len, lanes_per_column=lanes)
        assert torch.equal(got, want), (lanes, (got.float() - want.float()).abs().max().item())


# sha256 of the Triton commit's sm_90 PTX (benchmarks/gdn_tree_bench.py commit-ptx, Triton 3.6.0): the code that
# was bit-identical to SGLang 0.5.23's committed state on chains on the H200 (this session's runs 1-3)
COMMIT_PTX_SHA256 = {
    "fp32_prefetch0": "a81a1e92d26773f7e9ba76de952064494f05ffef0700e0c54ea2d3c6d5750eb6",
    "fp32_prefetch1": "0a1cba608d6e70bf0c8639a79d660f7dd4c5d98676936ed9ea3df74c5d06c67c",
    "bf16_prefetch0": "59f365a1e2b894d45339eeeee306e2b2d86b8b855647b795d65457502901e8c2",
    "bf16_prefetch1": "bc9423fb90b243faf14c4533c908b37d7f1eb9eca978fd12b671473d7097bd8a",
}


@pytest.mark.skipif(triton.__version__ != "3.6.0", reason="digests pinned for Triton 3.6.0")
def test_commit_ptx_is_the_one_verified_against_sglang():
    """The commit's float order is fragile (docs/kernels/gdn-tree.md): a changed digest needs the bench's parity
    section on the GPU, then the new digests here."""

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    env["PYTHONPATH"] = os.pathsep.join([str(root / "kernels"), str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gdn_tree_bench.py"), "commit-ptx"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(done.stdout) == COMMIT_PTX_SHA256
