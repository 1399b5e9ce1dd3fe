"""GDN tree verification on the H200: path-verify + commit vs SGLang 0.5.23's per-node-snapshot verify.

    python benchmarks/gdn_tree_bench.py prepare-sglang .sglang_gdn      # here: vendor SGLang's kernel
    PYTHONPATH=kernels:. python benchmarks/gdn_tree_bench.py commit-ptx   # here: the commit's PTX digests
    PYTHONPATH=kernels:.:.sglang_gdn python benchmarks/gdn_tree_bench.py run [--out FILE]   # on the GPU

``prepare-sglang`` copies ``fused_sigmoid_gating_recurrent.py`` unmodified out of the pinned wheel
(sha256 checked) into DIR, with import shims for the five helpers it imports from SGLang's utils.
``run`` prints one JSON document (the shared result header, then the figures; synthetic random inputs):
- bit parity on chains: each variant's commit (Triton with and without prefetch, CUDA lanes) vs SGLang's
  verify + snapshot copy (the committed state), and each variant's path-verify outputs vs SGLang's, on
  chains and on trees (SGLang's tree mode), with FP32 and bf16 pools;
- accuracy against the FP64 recurrence (torch reference);
- time of 48 GDN layers (Qwen3-Next/Qwen3.5 linear-attention heads: 16 key / 32 value heads,
  K = V = 128, FP32 state) for a 32-node tree at each of ``--batches``: path-verify + commit, verify
  alone and commit alone for each of ``--variants`` (``VERIFY_CONFIGS``; ``default`` is the library's
  defaults) vs SGLang verify writing every node's state + its commit copy, by CUDA-graph replay, with the
  state memory each needs, and whether each variant gives the first one's outputs;
- the WY kernel vs the path kernel (default options) at 32 and 64 nodes.
Each section's figures are written to ``--out`` as soon as it ends (the timing also after each batch);
a failing section or variant records its error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch
import triton

from specpilot_mem.bench.cuda_timing import graph_replay_us, record_section
from specpilot_mem.engine.sglang_kernels import prepare as prepare_sglang
from specpilot_mem.provenance import print_result, result_header, write_result

H, HV, K, V = 16, 32, 128, 128  # Qwen3-Next / Qwen3.5 linear-attention heads (SGLang configs/qwen3_next.py)
# path-verify variants timed side by side: last session's (replays every restart from the committed state),
# kept branch states + prefetch at SGLang's tile, wider value tiles, inputs prepared once per token
# (``prepare``), a register limit (``maxnreg``: more resident programs); commit_* are the commit's options
VERIFY_CONFIGS = [
    # the library's defaults (on an H200: the CUDA lanes kernel and commit)
    dict(name="default", max_saved=8, defaults=True),
    dict(name="replay_bv4", max_saved=0, prefetch=False, block_v=4, num_warps=1, commit_prefetch=False),
    dict(name="kept8_prefetch_bv4", max_saved=8, prefetch=True, block_v=4, num_warps=1, commit_prefetch=True),
    dict(name="kept8_prefetch_bv8w2", max_saved=8, prefetch=True, block_v=8, num_warps=2, commit_prefetch=True),
    # without prefetch: fewer registers per program (96 / 72 instead of 125 / 117), more resident warps
    dict(name="kept8_bv4", max_saved=8, prefetch=False, block_v=4, num_warps=1, commit_prefetch=False),
    # 64 registers: 32 one-warp programs per SM (the block limit) instead of 16; no spills without prefetch
    dict(
        name="kept8_bv4_r64",
        max_saved=8,
        prefetch=False,
        block_v=4,
        num_warps=1,
        maxnreg=64,
        commit_prefetch=False,
        commit_maxnreg=64,
    ),
    dict(
        name="prep_prefetch_bv4", max_saved=8, prefetch=True, block_v=4, num_warps=1, prepare=True, commit_prefetch=True
    ),
    dict(
        name="prep_bv4_r64",
        max_saved=8,
        prefetch=False,
        block_v=4,
        num_warps=1,
        prepare=True,
        maxnreg=64,
        commit_prefetch=False,
        commit_maxnreg=64,
    ),
    # the same verify with the faster commit (prefetch; 64 registers made the commit slower)
    dict(
        name="prep_bv4_r64_cpf",
        max_saved=8,
        prefetch=False,
        block_v=4,
        num_warps=1,
        prepare=True,
        maxnreg=64,
        commit_prefetch=True,
    ),
    # the step loop in CUDA with lanes along V (gdn_tree/lanes.py): P lanes per value column, W warps per block
    *[
        dict(
            name=f"lanes{p}_w{w}",
            max_saved=8,
            prefetch=True,
            block_v=4,
            num_warps=1,
            lanes=p,
            warps=w,
            commit_prefetch=True,
        )
        for p, w in ((4, 4), (8, 4), (8, 8), (16, 8), (8, 16), (4, 8))
    ],
    # the commit in CUDA too (its state must stay SGLang's bit for bit: see the parity section)
    *[
        dict(
            name=f"lanes{p}_w{w}_clanes{c}w{cw}",
            max_saved=8,
            prefetch=True,
            block_v=4,
            num_warps=1,
            lanes=p,
            warps=w,
            commit_prefetch=True,
            commit_lanes=c,
            commit_warps=cw,
        )
        for p, w, c, cw in (
            (4, 4, 4, 4),
            (8, 8, 8, 8),
            (8, 8, 16, 8),
            (16, 8, 16, 4),
            (8, 16, 8, 16),
            (4, 8, 4, 8),
            (8, 8, 8, 4),
        )
    ],
]


# what a run without --variants checks and times (all of them take longer than one 4-minute GPU call):
# the library's defaults, last session's kernels, the best Triton-only settings, CUDA verify + Triton commit
DEFAULT_VARIANTS = "default,kept8_prefetch_bv4,prep_bv4_r64_cpf,lanes8_w8"


def _selected(variants: str) -> list[dict]:
    """The VERIFY_CONFIGS named in a comma-separated list ("all": every one)."""
    return [c for c in VERIFY_CONFIGS if variants == "all" or c["name"] in variants.split(",")]


def _tile(cfg: dict) -> dict:
    """The path-verify options of a variant."""
    if cfg.get("defaults"):
        return {}
    return {
        "prefetch": cfg["prefetch"],
        "block_v": cfg["block_v"],
        "num_warps": cfg["num_warps"],
        "prepare_inputs": cfg.get("prepare", False),
        "max_registers": cfg.get("maxnreg"),
        "lanes_per_column": cfg.get("lanes"),
        "warps_per_block": cfg.get("warps", 4),
    }


def _commit_options(cfg: dict) -> dict:
    """The commit's options of a variant (bit parity with SGLang's commit is its contract: see the parity section)."""
    if cfg.get("defaults"):
        return {}
    return {
        "prefetch": cfg["commit_prefetch"],
        "max_registers": cfg.get("commit_maxnreg"),
        "lanes_per_column": cfg.get("commit_lanes"),
        "warps_per_block": cfg.get("commit_warps", 4),
    }


def random_tree(n: int, gen: torch.Generator, chain_bias: float = 0.6) -> list[int]:
    """One root (parent -1); node i hangs under i-1 with probability chain_bias, else under a random earlier node."""
    parents = [-1]
    for i in range(1, n):
        parents.append(
            i - 1 if torch.rand((), generator=gen) < chain_bias else int(torch.randint(0, i, (), generator=gen))
        )
    return parents


def make_inputs(
    B: int,
    T: int,
    gen: torch.Generator,
    state_dtype=torch.float32,
    layers: int = 1,
    heads: tuple[int, int, int, int] = (H, HV, K, V),
    device: str = "cuda",
):
    """Random bf16 inputs of one verify step (CPU generator, then ``device``): q, k, v, a, b, A_log, dt_bias, one
    state pool per layer and the slot indices; ``heads`` is (H, HV, K, V)."""
    nh, nhv, nk, nv = heads

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(torch.bfloat16).to(device)

    q, k, v = r(B, T, nh, nk), r(B, T, nh, nk), r(B, T, nhv, nv)
    a, b = r(B, T, nhv), r(B, T, nhv)
    A_log = (torch.rand(nhv, generator=gen) * 2 - 1).to(device)
    dt_bias = (torch.randn(nhv, generator=gen) * 0.5).to(device)
    pools = [(torch.randn(B, nhv, nv, nk, generator=gen) * 0.1).to(state_dtype).to(device) for _ in range(layers)]
    idx = torch.arange(B, dtype=torch.int32, device=device)
    return q, k, v, a, b, A_log, dt_bias, pools, idx


def sglang_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, inter, parents=None):
    """SGLang 0.5.23's target-verify call (as gdn_backend makes it): outputs [B, T, HV, V]; fills ``inter``."""
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    B, T = q.shape[:2]
    o = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log,
        a=a.view(B * T, HV),
        dt_bias=dt_bias,
        softplus_beta=1.0,
        softplus_threshold=20.0,
        q=q.view(1, B * T, H, K),
        k=k.view(1, B * T, H, K),
        v=v.view(1, B * T, HV, V),
        b=b.view(B * T, HV),
        initial_state_source=pool,
        initial_state_indices=idx,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(0, B * T + 1, T, dtype=torch.int32, device="cuda"),
        disable_state_update=True,
        intermediate_states_buffer=inter,
        intermediate_state_indices=torch.arange(B, dtype=torch.int32, device="cuda"),
        cache_steps=T,
        retrieve_parent_token=parents,
    )
    return o.view(B, T, HV, V)


def parity(gen, variants: str = "") -> dict:
    """Bit parity with SGLang's kernel: committed states and outputs on chains, outputs on trees (each variant)."""
    from specpilot_kernels.gdn_tree import gdn_tree_commit, gdn_tree_path_verify, tree_schedule

    configs = _selected(variants)
    out = {}
    for state_dtype in (torch.float32, torch.bfloat16):
        B, T = 4, 16
        q, k, v, a, b, A_log, dt_bias, (pool,), idx = make_inputs(B, T, gen, state_dtype)
        inter = torch.empty((B, T, HV, V, K), dtype=state_dtype, device="cuda")
        o_sglang = sglang_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, inter)
        chain = torch.tensor([[-1] + list(range(T - 1))] * B, device="cuda")
        accept_len = torch.randint(1, T + 1, (B,), generator=gen).cuda()
        committed_sglang = pool.clone()
        committed_sglang[idx.long()] = inter[torch.arange(B, device="cuda"), accept_len - 1]
        name = str(state_dtype).split(".")[-1]
        commit_options = [_commit_options({"commit_prefetch": prefetch}) for prefetch in (False, True)]
        commit_options += [o for o in map(_commit_options, configs) if o not in commit_options]
        for options in commit_options:
            tag = name + (
                "_default"
                if not options
                else f"_prefetch{int(options['prefetch'])}"
                + (f"_r{options['max_registers']}" if options["max_registers"] else "")
                + (
                    f"_lanes{options['lanes_per_column']}w{options['warps_per_block']}"
                    if options["lanes_per_column"]
                    else ""
                )
            )
            committed_ours = pool.clone()
            try:
                gdn_tree_commit(
                    q,
                    k,
                    v,
                    a,
                    b,
                    A_log,
                    dt_bias,
                    committed_ours,
                    idx,
                    torch.arange(T, device="cuda").repeat(B, 1),
                    accept_len,
                    **options,
                )
            except Exception as exc:  # a failing option (e.g. its CUDA build) leaves the others' checks
                out[f"chain_commit_error_{tag}"] = f"{type(exc).__name__}: {exc}"
                continue
            out[f"chain_commit_bit_identical_{tag}"] = bool(torch.equal(committed_ours, committed_sglang))
            out[f"chain_commit_max_abs_diff_{tag}"] = (
                (committed_ours.float() - committed_sglang.float()).abs().max().item()
            )
        for cfg in configs:
            try:
                o_ours = gdn_tree_path_verify(
                    q,
                    k,
                    v,
                    a,
                    b,
                    A_log,
                    dt_bias,
                    pool,
                    idx,
                    tree_schedule(chain, max_saved=cfg["max_saved"]),
                    **_tile(cfg),
                )
                out[f"chain_outputs_bit_identical_{name}_{cfg['name']}"] = bool(torch.equal(o_ours, o_sglang))
            except Exception as exc:  # a failing variant (e.g. its CUDA build) leaves the others' checks
                out[f"chain_outputs_error_{name}_{cfg['name']}"] = f"{type(exc).__name__}: {exc}"
        # trees: SGLang's tree mode reloads each parent's snapshot; ours replays root paths / restores kept states
        T = 32
        q, k, v, a, b, A_log, dt_bias, (pool,), idx = make_inputs(B, T, gen, state_dtype)
        parents = torch.tensor([random_tree(T, gen) for _ in range(B)], device="cuda")
        inter = torch.empty((B, T, HV, V, K), dtype=state_dtype, device="cuda")
        o_sglang = sglang_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, inter, parents=parents)
        o_first = None
        for cfg in configs:
            try:
                o_ours = gdn_tree_path_verify(
                    q,
                    k,
                    v,
                    a,
                    b,
                    A_log,
                    dt_bias,
                    pool,
                    idx,
                    tree_schedule(parents, max_saved=cfg["max_saved"]),
                    **_tile(cfg),
                )
            except Exception as exc:
                out[f"tree_outputs_error_{name}_{cfg['name']}"] = f"{type(exc).__name__}: {exc}"
                continue
            o_first = o_ours if o_first is None else o_first
            out[f"tree_outputs_bit_identical_{name}_{cfg['name']}"] = bool(torch.equal(o_ours, o_sglang))
            out[f"tree_outputs_max_abs_diff_{name}_{cfg['name']}"] = (
                (o_ours.float() - o_sglang.float()).abs().max().item()
            )
            out[f"tree_outputs_equal_first_variant_{name}_{cfg['name']}"] = bool(torch.equal(o_ours, o_first))
    return out


def accuracy(gen) -> dict:
    from specpilot_kernels.gdn_tree import gdn_tree_path_verify, tree_schedule
    from specpilot_kernels.gdn_tree import reference as R

    B, T = 2, 24
    q, k, v, a, b, A_log, dt_bias, (pool,), idx = make_inputs(B, T, gen)
    parents = torch.tensor([random_tree(T, gen, 0.3) for _ in range(B)], device="cuda")
    o = gdn_tree_path_verify(q.float(), k.float(), v.float(), a, b, A_log, dt_bias, pool, idx, tree_schedule(parents))
    ref = R.path_verify_reference(
        q.double(),
        k.double(),
        v.double(),
        a.double(),
        b.double(),
        A_log.double(),
        dt_bias.double(),
        pool.double(),
        idx,
        parents,
        torch.full((B,), T),
    )
    err = (o.double() - ref.double()).norm() / ref.double().norm()
    return {"path_verify_fp32_inputs_rel_l2_vs_fp64_reference": err.item()}


def timing(
    gen, layers: int, variants: str = "", batches: tuple[int, ...] = (1, 4, 8, 16, 32), on_row=lambda rows: None
) -> list[dict]:
    """Each batch's row; ``on_row(rows so far)`` after each, so a run cut short keeps its finished batches."""
    rows = []
    for B in batches:
        rows.append(time_batch(gen, B, 32, layers, variants))
        on_row(rows)
    return rows


def deepest_root_paths(parents: torch.Tensor) -> list[list[int]]:
    """Per request, the root path to its deepest node (an optimistic acceptance)."""
    paths = []
    for plist in parents.tolist():
        depth = [0] * len(plist)
        for i in range(1, len(plist)):
            depth[i] = depth[plist[i]] + 1
        node, path = max(range(len(plist)), key=lambda i: depth[i]), []
        while node >= 0:
            path.append(node)
            node = plist[node]
        paths.append(path[::-1])
    return paths


def time_batch(gen, B: int, T: int, layers: int, variants: str) -> dict:
    """One batch's row: SGLang's snapshot verify + commit, then each variant's verify + commit, verify and commit."""
    from specpilot_kernels.gdn_tree import gdn_tree_commit, gdn_tree_path_verify, tree_schedule

    q, k, v, a, b, A_log, dt_bias, pools, idx = make_inputs(B, T, gen, layers=layers)
    pool_before = pools[0].clone()  # the timed commits change the pools
    parents = torch.tensor([random_tree(T, gen) for _ in range(B)], device="cuda")
    paths = deepest_root_paths(parents)
    accept_len = torch.tensor([len(p) for p in paths], dtype=torch.int32, device="cuda")
    accepted = torch.tensor([p + [0] * (T - len(p)) for p in paths], dtype=torch.int32, device="cuda")
    inter = torch.empty((B, T, HV, V, K), dtype=torch.float32, device="cuda")
    rows_b = torch.arange(B, device="cuda")

    def stock():
        for pool in pools:
            sglang_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, inter, parents=parents)
            pool[idx.long()] = inter[rows_b, accept_len - 1, :, :, :]

    def verify_only(cfg):
        schedule = tree_schedule(parents, max_saved=cfg["max_saved"])
        for pool in pools:
            gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, schedule, **_tile(cfg))

    def commit_only(cfg):
        for pool in pools:
            gdn_tree_commit(q, k, v, a, b, A_log, dt_bias, pool, idx, accepted, accept_len, **_commit_options(cfg))

    def ours(cfg):
        verify_only(cfg)
        commit_only(cfg)

    stock_us = graph_replay_us(lambda _: stock())
    row = {
        "B": B,
        "T": T,
        "layers": layers,
        "sglang_snapshot_verify_plus_commit_us": stock_us,
        "sglang_per_node_state_bytes": layers * B * T * HV * V * K * 4,
        "accept_len": accept_len.tolist(),
        "variants": [],
    }
    o_reference = None
    for cfg in _selected(variants):
        try:
            ours_us = graph_replay_us(lambda _, cfg=cfg: ours(cfg))
            verify_us = graph_replay_us(lambda _, cfg=cfg: verify_only(cfg))
            commit_us = graph_replay_us(lambda _, cfg=cfg: commit_only(cfg))
            schedule = tree_schedule(parents, max_saved=cfg["max_saved"])
            # every variant must give the first one's outputs (the schedules do not change results)
            o_first_layer = gdn_tree_path_verify(
                q, k, v, a, b, A_log, dt_bias, pool_before, idx, schedule, **_tile(cfg)
            )
            if o_reference is None:
                o_reference = o_first_layer
            same_outputs = bool(torch.equal(o_first_layer, o_reference))
            row["variants"].append(
                {
                    **cfg,
                    "ours_path_verify_plus_commit_us": ours_us,
                    "ours_verify_only_us": verify_us,
                    "ours_commit_only_us": commit_us,
                    "outputs_equal_first_variant": same_outputs,
                    "speedup": stock_us / ours_us,
                    "ours_per_node_state_bytes": 0,
                    # kept branch states: a scratch of max_saved states per request, live during one layer's call
                    "ours_branch_state_scratch_bytes": B * cfg["max_saved"] * HV * V * K * 4,
                    "steps_per_request_with_replays": schedule.replayed_steps().tolist(),
                    "states_kept_per_request": (schedule.save_slot >= 0).sum(1).tolist(),
                }
            )
        except Exception as exc:  # a failing variant (e.g. its CUDA build) leaves the others' figures
            row["variants"].append({"name": cfg["name"], "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps({"B": B, **row["variants"][-1]}), file=sys.stderr, flush=True)
    best = max((r for r in row["variants"] if "speedup" in r), key=lambda r: r["speedup"], default=None)
    if best is not None:
        row["best_variant"], row["best_speedup"] = best["name"], best["speedup"]
    return row


def bf16_ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of want's bf16 ulp (2^(e-7) for |want| in [2^e, 2^(e+1)))."""
    _, exponent = torch.frexp(want.float().abs().clamp_min(2.0**-120))
    return (got.float() - want.float()).abs() / torch.ldexp(torch.ones_like(want.float()), exponent - 8)


def wy_vs_path(gen, layers: int) -> list[dict]:
    rows = []
    for T in (32, 64):
        for B in (1, 8):
            rows.append(wy_row(gen, T, B, layers))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def wy_row(gen, T: int, B: int, layers: int) -> dict:
    """The WY kernel against the path kernel (default options) on one batch of random trees: time and bf16 ulps."""
    from specpilot_kernels.gdn_tree import gdn_tree_path_verify, gdn_tree_wy_verify, tree_ancestors, tree_schedule

    q, k, v, a, b, A_log, dt_bias, pools, idx = make_inputs(B, T, gen, layers=layers)
    parents = torch.tensor([random_tree(T, gen) for _ in range(B)], device="cuda")
    schedule, ancestors = tree_schedule(parents), tree_ancestors(parents)
    o_path = gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pools[0], idx, schedule)
    o_wy = gdn_tree_wy_verify(q, k, v, a, b, A_log, dt_bias, pools[0], idx, ancestors)
    ulps = bf16_ulps(o_wy, o_path)

    def path_all():
        for pool in pools:
            gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, schedule)

    def wy_all():
        for pool in pools:
            gdn_tree_wy_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, ancestors)

    path_us, wy_us = graph_replay_us(lambda _: path_all()), graph_replay_us(lambda _: wy_all())
    return {
        "T": T,
        "B": B,
        "layers": layers,
        "path_verify_us": path_us,
        "wy_verify_us": wy_us,
        "wy_speedup": path_us / wy_us,
        "wy_vs_path_max_bf16_ulps": ulps.max().item(),
        "wy_vs_path_frac_within_1_ulp": (ulps <= 1).float().mean().item(),
        "path_steps_per_request": schedule.replayed_steps().tolist(),
    }


def sm90_ptx_sha256(kernel, types: dict, constants: dict, num_warps: int, num_stages: int) -> str:
    """sha256 of ``kernel``'s PTX code compiled here for sm_90 (no GPU needed) with ``constants`` specialised and
    every pointer 16-byte aligned (Triton assumes it at launch, and it changes the layouts). Debug sections, line
    records and debug labels are left out (they move with inlining, the code does not), so only instructions count.
    """
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    signature = {name: "constexpr" if name in constants else types[name] for name in names}
    source = ASTSource(
        kernel,
        signature,
        constexprs={(names.index(name),): value for name, value in constants.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if signature[name].startswith("*")},
    )
    ptx = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    code = [line.strip() for line in ptx.asm["ptx"].split(".section")[0].splitlines()]
    text = "\n".join(
        line
        for line in code
        if line and not line.startswith((".loc", ".file", "//")) and not re.fullmatch(r"\$L__tmp\d+:", line)
    )
    return hashlib.sha256(text.encode()).hexdigest()


def path_kernel_types(pool: str) -> dict:
    """The argument types ``gdn_tree_path_verify`` / ``gdn_tree_commit`` launch the path kernel with (bf16 inputs)."""
    return {
        **{
            name: "*i32"
            for name in ("state_indices", "order", "replay_len", "replay", "restore_slot", "save_slot", "num_nodes")
        },
        **{name: "*bf16" for name in ("q", "k", "v", "a", "b", "o")},
        "A_log": "*fp32",
        "dt_bias": "*fp32",
        "saved": "*fp32",
        "state_pool": f"*{pool}",
        "write_state": "i32",
        "softplus_beta": "fp32",
        "softplus_threshold": "fp32",
        "scale": "fp32",
    }


def commit_ptx_digests(nodes: int = 16) -> dict[str, str]:
    """sha256 of the Triton commit's PTX code per specialisation (pool dtype x prefetch), compiled here for sm_90
    as ``gdn_tree_commit`` launches it at the parity section's shape, ``write_state`` = 1 specialised
    (:func:`sm90_ptx_sha256`). The commit's float order is fragile (docs/kernels/gdn-tree.md): a new digest means
    the parity section must run on the GPU again.
    """
    from specpilot_kernels.gdn_tree.path_verify import _path_verify_kernel

    digests = {}
    for pool in ("fp32", "bf16"):
        for prefetch in (False, True):
            constants = dict(
                write_state=1,
                T=nodes,
                H=H,
                HV=HV,
                K=K,
                V=V,
                BK=K,
                BV=4,
                USE_QK_L2NORM=True,
                MAX_SAVED=0,
                PREFETCH=prefetch,
                PREPARED=False,
            )
            digests[f"{pool}_prefetch{int(prefetch)}"] = sm90_ptx_sha256(
                _path_verify_kernel, path_kernel_types(pool), constants, num_warps=1, num_stages=3
            )
    return digests


def _save_partial(result: dict, name: str, figures, out: str | None) -> None:
    """Write ``result`` with a section's figures so far to ``out`` (the section's final record replaces them)."""
    if out:
        write_result({**result, name: figures, "partial": name}, out)


def run_all(args) -> dict:
    gen = torch.Generator().manual_seed(0)
    result = {
        **result_header("gdn_tree_bench"),
        "synthetic": "random bf16 inputs, random FP32 states, random trees",
        "shape": {"H": H, "HV": HV, "K": K, "V": V},
        "timing": "CUDA-graph replay of one verify step over all layers, median of 20",
    }
    sections = [
        ("parity_with_sglang_0_5_23", lambda: parity(gen, args.variants)),
        ("accuracy", lambda: accuracy(gen)),
        (
            "verify_plus_commit",
            lambda: timing(
                gen,
                args.layers,
                args.variants,
                tuple(int(x) for x in args.batches.split(",")),
                lambda rows: _save_partial(result, "verify_plus_commit", rows, args.out),
            ),
        ),
        ("wy_vs_path", lambda: wy_vs_path(gen, args.layers)),
    ]
    for name, run in sections:
        if args.sections and name not in args.sections.split(","):
            continue
        record_section(result, name, run, args.out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    prep = sub.add_parser("prepare-sglang")
    prep.add_argument("target")
    sub.add_parser("commit-ptx", help="sha256 of the Triton commit's sm_90 PTX per specialisation (no GPU needed)")
    run = sub.add_parser("run")
    run.add_argument("--out", default=None)
    run.add_argument("--layers", type=int, default=48)
    run.add_argument(
        "--sections",
        default="",
        help="comma-separated sections to run (default: all): "
        "parity_with_sglang_0_5_23, accuracy, verify_plus_commit, wy_vs_path",
    )
    run.add_argument("--batches", default="1,4,8,16,32", help="comma-separated batch sizes timed")
    run.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help=f"comma-separated VERIFY_CONFIGS names to check and time, or all (default: {DEFAULT_VARIANTS})",
    )
    args = parser.parse_args()
    if args.verb == "prepare-sglang":
        print(json.dumps(prepare_sglang(args.target)))
    elif args.verb == "commit-ptx":
        print(json.dumps(commit_ptx_digests(), indent=1))
    else:
        print_result(run_all(args), args.out)


if __name__ == "__main__":
    main()
