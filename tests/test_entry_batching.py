"""The batching SGLang entries (``shared-budget``, ``drafter-block``, ``prompt-admission``) on the CPU, through the
export of every SGLang entry applied to stock.

A fresh process imports the patched SGLang and checks, against the project's batching policies
(``specpilot_mem.batching``, the tested reference) and the replay package:

- server arguments: a stock command line and dflash-tree's own resolve as before (every batching flag unset);
  bad batching flags are refused while parsing, each naming its flag and the limit;
- the shared budget: the shares of trees built from a real ``CandidateSelector`` lattice equal
  ``batching.shared_shares``, the cut trees equal the replay's truncated best-first trees, the plateau budget
  from a measured c(R) file equals ``CostCurve.plateau_end``, and the ragged verify (lengths, packed tokens,
  positions, custom mask, SGLang's ``RaggedVerifyLayout``, unpacking) equals brute-force constructions;
  acceptance on the cut trees equals the walking reference;
- start-up: with the flags unset the tree decoder carries no budget; an attention backend without the ragged
  verify, or a hybrid target, is refused;
- prompt admission: its flags (refused without a shared budget, a segment past the verify buffers), the decision
  equal to the project's ``PromptAdmission.admitted_prompts`` for one prompt, the budget's lowest nodes giving way
  (``make_room``), the mixed verify of trees and a prompt chunk against brute force, and the scheduler's hand-off
  on stand-ins of its objects (a middle chunk rides; a last chunk, a chunk over the segment, a new prompt prefill;
  with the flag unset nothing is touched).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from specpilot_mem.sglang.cpu_import import import_environment, write_torchvision_standin
from tests.test_entry_dflash_tree import write_models

pytestmark = pytest.mark.sglang

PROBE = textwrap.dedent(r"""
    import json, sys, types
    from pathlib import Path
    import numpy as np
    import torch

    models, costs_file, drafter_costs = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.runtime_context import get_context

    base = ["--model-path", str(models / "target"), "--device", "cuda", "--skip-tokenizer-init"]
    dflash = base + ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(models / "dflash2")]
    tree = dflash + ["--specpilot-tree-nodes", "32", "--specpilot-tree-drafted-positions", "16"]
    out = {}

    def resolved(argv):
        args = prepare_server_args(argv)
        args.resolve_once()
        return args

    def refused(cases):
        got = {}
        for name, argv in cases.items():
            try:
                resolved(argv)
                got[name] = None
            except ValueError as err:
                got[name] = {"flag": getattr(err, "flag", None), "message": str(err)}
        return got

    stock = resolved(dflash)
    view = resolving_view(stock)
    out["stock"] = {"rows": view.specpilot_shared_budget_rows, "costs": view.specpilot_shared_budget_costs,
                    "window": view.speculative_num_draft_tokens}
    with_tree = resolved(tree)
    out["tree_window"] = resolving_view(with_tree).speculative_num_draft_tokens
    shared = resolved(tree + ["--specpilot-shared-budget-rows", "128", "--max-running-requests", "16"])
    out["shared"] = {"rows": resolving_view(shared).specpilot_shared_budget_rows,
                     "window": resolving_view(shared).speculative_num_draft_tokens}
    rows = "--specpilot-shared-budget-rows"
    out["refused"] = refused({
        "budget_below_requests": tree + [rows, "8", "--max-running-requests", "16"],
        "budget_without_request_cap": tree + [rows, "128"],
        "budget_over_buffers": tree + [rows, "100", "--max-running-requests", "2"],
        "budget_without_trees": dflash + [rows, "128", "--max-running-requests", "16"],
        "budget_zero": tree + [rows, "0", "--max-running-requests", "16"],
        "rows_and_costs": tree + [rows, "128", "--max-running-requests", "16",
                                  "--specpilot-shared-budget-costs", costs_file],
        "costs_unreadable": tree + ["--specpilot-shared-budget-costs", str(models / "target" / "config.json")],
    })

    budget = tree + [rows, "128", "--max-running-requests", "16"]
    blocks = "--specpilot-drafter-blocks"
    with_blocks = resolved(budget + [blocks, "16,12,8", "--specpilot-drafter-costs", drafter_costs])
    out["blocks"] = resolving_view(with_blocks).specpilot_drafter_blocks
    out["refused_blocks"] = refused({
        "block_over_drafted": budget + [blocks, "17,12", "--specpilot-drafter-costs", drafter_costs],
        "block_zero": budget + [blocks, "16,0", "--specpilot-drafter-costs", drafter_costs],
        "blocks_not_numbers": budget + [blocks, "16,twelve", "--specpilot-drafter-costs", drafter_costs],
        "blocks_without_budget": tree + [blocks, "16,12,8", "--specpilot-drafter-costs", drafter_costs],
        "blocks_without_costs": budget + [blocks, "16,12,8"],
        "costs_without_blocks": budget + ["--specpilot-drafter-costs", drafter_costs],
    })

    # shares over trees built from a real CandidateSelector lattice, against the project's policies
    from sglang.srt.models.dflash import CandidateSelector
    from sglang.srt.specpilot.batching_args import load_cost_curve
    from sglang.srt.specpilot.batching_checks.shared_budget import BudgetSettings
    from sglang.srt.specpilot.dflash_tree import TreeStep
    from sglang.srt.specpilot.dflash_tree_args import tree_settings
    from sglang.srt.specpilot.kernels.draft_tree import greedy_accept_reference, verify_layout_reference
    from sglang.srt.specpilot.shared_budget import RaggedTreeVerify, SharedBudget, compact_step, shared_shares
    from specpilot_mem.batching import CostCurve, shared_shares as project_shares
    from specpilot_mem.replay.trees import get_builder
    from specpilot_mem.replay.trees.base import StepBatch

    torch.manual_seed(0)
    B, P, K, V, H, N = 6, 16, 16, 512, 32, 32
    selector = CandidateSelector(hidden_size=H, vocab_size=V, state_rank=8, top_k=K)
    with torch.no_grad():
        for p in selector.parameters():
            p.normal_(0, 0.7)
        unary, cand = (torch.randn(B, P, V) * 2).topk(K, dim=-1)
        anchor = torch.randint(0, V, (B,))
        scores = selector.build_lattice(candidate_ids=cand, unary_logits=unary, hidden_states=torch.randn(B, P, H),
                                        anchor_token_ids=anchor).float()
    settings = tree_settings(N, 15, P, algorithm="DFLASH", trained_block=17, selector_top_k=K)
    prefix = torch.tensor([5, 0, 11, 3, 7, 2])
    step = TreeStep.build(settings, cand, scores, anchor, prefix)
    replay = get_builder("best-first")(StepBatch.from_scores(cand, unary.numpy(), scores.numpy()), N, 15)
    shares = {}
    for nodes in (0, 1, 5, 40, 100, 150, 500):
        mine = shared_shares(step.tree.scores, nodes)
        cut = compact_step(step, torch.arange(N)[None, :] < mine[:, None], anchor, prefix)
        want = replay.truncate(mine.numpy())
        shares[nodes] = {
            "equal_project": bool(torch.equal(mine, project_shares(step.tree.scores, nodes))),
            "total": int(mine.sum()), "uneven": int(mine.max() - mine.min()),
            "cut_equal_replay": bool(np.array_equal(cut.tree.parents.numpy(), want.parents)
                                     and np.array_equal(cut.tokens[:, 1:].masked_fill(cut.tree.depths == 0, -1).numpy(),
                                                        want.tokens)
                                     and bool((cut.tokens[:, 1:][cut.tree.depths == 0] ==
                                               anchor[:, None].expand(B, N)[cut.tree.depths == 0]).all())
                                     and np.array_equal(cut.tree.scores.numpy(), want.scores)
                                     and np.array_equal(cut.tree.num_nodes.numpy(), want.num_nodes)),
            "layout_equal": all(bool(torch.equal(getattr(cut.layout, f), getattr(ref, f)))
                                for ref in [verify_layout_reference(cut.tree.parents, cut.tree.num_nodes, prefix)]
                                for f in ref._fields),
        }
    out["shares"] = shares
    full = compact_step(step, torch.ones(B, N, dtype=torch.bool), anchor, prefix)
    out["compact_full_is_identity"] = (all(bool(torch.equal(a, b)) for a, b in zip(full.tree, step.tree))
                                       and bool(torch.equal(full.tokens, step.tokens))
                                       and all(bool(torch.equal(a, b)) for a, b in zip(full.layout, step.layout)))

    # the plateau budget from a measured c(R) file
    curve = load_cost_curve(costs_file, "--specpilot-shared-budget-costs")
    project = CostCurve(**json.loads(Path(costs_file).read_text()))
    out["plateau_equal"] = all(curve.plateau_end(r, 0.05) == project.plateau_end(r, 0.05)
                               for r in range(1, 2100, 7))
    budget = BudgetSettings(N, curve=curve)
    out["plateau_rows"] = {b: budget.rows_for(b) for b in (1, 8, 16, 32, 64)}
    out["plateau_rows_project"] = {b: min(project.plateau_end(b, 0.05), b * (N + 1)) for b in (1, 8, 16, 32, 64)}

    # the ragged verify of a cut step against brute force
    cut = SharedBudget(BudgetSettings(N, rows=B + 40)).share(step, anchor, prefix, torch.arange(B))
    ragged = RaggedTreeVerify.from_step(cut, prefix)
    lens = (cut.tree.num_nodes + 1).tolist()
    brute = verify_layout_reference(cut.tree.parents, cut.tree.num_nodes, prefix)
    mask_rows, cols, toks, poss = [], [], [], []
    for b in range(B):
        for i in range(lens[b]):
            mask_rows.append(torch.cat([torch.ones(int(prefix[b]), dtype=torch.bool), brute.mask[b, i, :lens[b]]]))
            cols.append(b * (N + 1) + i)
            toks.append(int(cut.tokens[b, i]))
            poss.append(int(brute.positions[b, i]))
    out["ragged"] = {
        "total_rows": int(ragged.verify_lens.sum()), "lens_ok": ragged.verify_lens.tolist() == lens,
        "mask_equal": bool(torch.equal(ragged.custom_mask, torch.cat(mask_rows))),
        "columns_equal": ragged.columns.tolist() == cols, "tokens_equal": ragged.tokens.tolist() == toks,
        "positions_equal": ragged.positions.tolist() == poss,
    }
    layout = ragged.layout(torch.device("cpu"))
    out["ragged"]["layout_ok"] = (layout.qo_indptr_device.tolist() == [0] + np.cumsum(lens).tolist()
                                  and layout.total_verify_tokens == sum(lens) == layout.graph_num_tokens)
    every = RaggedTreeVerify.from_step(step, prefix)
    out["ragged"]["full_mask_is_padded_mask"] = bool(torch.equal(every.custom_mask, step.custom_mask(prefix)))
    packed = torch.randn(int(ragged.verify_lens.sum()), 3)
    unpacked = ragged.unpack(packed, fill=-7.0)
    live = torch.arange(N + 1)[None, :] < torch.tensor(lens)[:, None]
    out["ragged"]["unpack_ok"] = bool(torch.equal(unpacked[live], packed) and bool((unpacked[~live] == -7.0).all()))

    # acceptance on the cut trees (the target's argmax unpacked from ragged rows follows request 0's deepest path)
    predict = torch.randint(0, V, (B, N + 1))
    node = int(cut.tree.depths[0].argmax())
    path = []
    while node >= 0:
        path.insert(0, node)
        node = int(cut.tree.parents[0, node])
    col = 0
    for node in path:
        predict[0, col] = cut.tokens[0, node + 1]
        col = node + 1
    predict = ragged.unpack(predict.reshape(-1)[ragged.columns])
    acc = cut.accept(predict)
    ref = greedy_accept_reference(cut.tokens[:, 1:], cut.tree.parents, cut.tree.num_nodes, predict)
    out["accept_equal"] = all(bool(torch.equal(a, b)) for a, b in zip(acc, ref))
    out["accept_0"], out["deepest_0"] = int(acc.accept_length[0]), len(path)

    # start-up
    from sglang.srt.specpilot.dflash_tree import TreeDecoder

    def worker(backend):
        return types.SimpleNamespace(
            selector=selector, draft_model=types.SimpleNamespace(block_size=16), block_size=33,
            use_compact_draft_cache=False,
            target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
                server_args=types.SimpleNamespace(attention_backend=backend, max_running_requests=16))))

    get_context().set_server_args(with_tree)
    out["decoder_without_budget"] = TreeDecoder.from_worker(worker("triton")).shared is None
    get_context().set_server_args(shared)
    try:
        TreeDecoder.from_worker(worker("triton"))
        out["triton_refused"] = None
    except ValueError as err:
        out["triton_refused"] = str(err)
    decoder = TreeDecoder.from_worker(worker("flashinfer"))
    out["flashinfer_rows"] = {b: decoder.shared.settings.rows_for(b) for b in (1, 16)}
    hybrid = worker("flashinfer")
    hybrid.target_worker.model_runner.model_config = types.SimpleNamespace(hf_config=None)
    from sglang.srt.configs import hybrid_arch
    hybrid_arch.mambaish_config = lambda config: object()  # a recurrent-state target
    import sglang.srt.specpilot.shared_budget as sb
    try:
        sb.SharedBudget.from_worker(hybrid, decoder.settings)
        out["hybrid_refused"] = None
    except ValueError as err:
        out["hybrid_refused"] = str(err)

    # drafter blocks: the choice against the project's DrafterBlocks, the per-slot state, capped shares
    from sglang.srt.specpilot.batching_checks.drafter_block import BlockSettings
    from sglang.srt.specpilot.drafter_block import BlockState, DrafterBlocks
    from specpilot_mem.batching.blocks import DrafterBlocks as ProjectBlocks

    dcurve = load_cost_curve(drafter_costs, "--specpilot-drafter-costs")
    project_curve = CostCurve(**json.loads(Path(drafter_costs).read_text()))
    mine, theirs = DrafterBlocks(BlockSettings((8, 12, 16), dcurve)), ProjectBlocks(16, project_curve, (16, 12, 8))
    equal, shrunk = True, 0
    gen = torch.Generator().manual_seed(1)
    for b in (1, 8, 16, 24, 32, 64):
        recent = torch.rand(b, generator=gen) * 16
        conf = torch.randint(0, 16, (b,), generator=gen)
        got = mine.choose(recent, conf)
        equal &= bool(torch.equal(got, theirs.choose(recent, conf)))
        equal &= bool(torch.equal(mine.update(recent, conf), theirs.update(recent, conf)))
        shrunk += int((got < 16).sum())
    out["blocks_equal_project"], out["blocks_shrunk"] = equal, shrunk

    pool = types.SimpleNamespace(req_generation=torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]))
    state = BlockState(DrafterBlocks(BlockSettings((8, 12, 16), dcurve)), pool)
    state.blocks.drafter_rows = lambda requests: requests * 13  # a plateau that holds 12-blocks only
    slots = torch.tensor([2, 5, 0, 7, 1, 3])
    first = state.caps(slots, prefix)  # new requests: the largest block, then fitted
    state.observe(slots, step.tree.depths, torch.full((B,), 3))
    moved = prefix + torch.tensor([1, 9, 1, 4, 1, 1])  # accepted 0, 8, 0, 3, 0, 0 draft tokens
    pool.req_generation[3] += 1  # slot 3 (request 5 of the step) now holds a new request
    second_recent_want = torch.maximum(torch.tensor([0., 8., 0., 3., 0., 0.]), torch.full((B,), 16 * 0.75))
    second_recent_want[5] = 16.0
    second = state.caps(slots, moved)
    out["state"] = {"first": first.tolist(), "second": second.tolist(),
                    "recent_ok": bool(torch.equal(state.recent[slots], second_recent_want)),
                    "fit_rows_ok": int((second + 1).sum()) <= 13 * B}
    shared_blocks = SharedBudget(BudgetSettings(N, rows=B + 40), state)
    caps = torch.tensor([8, 12, 16, 8, 12, 16])
    state.caps = lambda req_pool_indices, prefix_lens: caps
    cut = shared_blocks.share(step, anchor, prefix, slots)
    masked = torch.where(step.tree.depths <= caps[:, None], step.tree.scores, float("-inf"))
    counts = project_shares(masked, 40)
    ok = bool(torch.equal(cut.tree.num_nodes, counts)) and bool((cut.tree.depths <= caps[:, None]).all())
    for b in range(B):
        allowed = [i for i in range(N) if int(step.tree.depths[b, i]) <= int(caps[b])][: int(counts[b])]
        ok &= cut.tokens[b, 1:1 + len(allowed)].tolist() == [int(step.tokens[b, i + 1]) for i in allowed]
    out["capped_shares_ok"] = ok
    out["capped_confidence"] = state.confidence[slots].tolist() == [int(cut.tree.depths[b].max()) for b in range(B)]

    # prompt admission: the flags, the decision against the project's PromptAdmission, the mixed verify
    admit, seg = "--specpilot-prompt-admission", "--specpilot-prompt-segment"
    budget_argv = tree + [rows, "128", "--max-running-requests", "16"]
    with_admission = resolved(budget_argv + [admit, seg, "64"])
    out["admission"] = {"stock": resolving_view(stock).specpilot_prompt_admission,
                        "on": resolving_view(with_admission).specpilot_prompt_admission,
                        "segment": resolving_view(with_admission).specpilot_prompt_segment}
    out["refused_admission"] = refused({
        "admission_without_budget": tree + [admit],
        "segment_over_buffers": budget_argv + [admit, seg, "128"],
        "segment_zero": budget_argv + [admit, seg, "0"],
        "segment_without_admission": budget_argv + [seg, "64"],
        "costs_budget_without_request_cap": tree + ["--specpilot-shared-budget-costs", costs_file, admit],
    })

    from sglang.srt.specpilot.prompt_admission import (
        MixedVerify, PromptAdmission as EntryAdmission, Segment, admits, hand_off, make_room)
    from sglang.srt.specpilot.batching_checks.prompt_admission import AdmissionSettings
    from specpilot_mem.batching.admission import PromptAdmission as ProjectAdmission

    grid_equal, grid_admitted = True, 0
    for requests in (1, 8, 16, 32):
        spare = project.plateau_end(requests, 0.05) - requests
        for rows in (1, 16, 64, 112, 200):
            for tau in (1.3, 2.5):  # values off the rule's exact ties (float rounding decides those)
                for value in (0.0, 0.07, 0.4):
                    for step_ms, prefill_ms in ((10.0, 2.0), (10.0, 9.0), (10.0, 30.0)):
                        # a chunk rides whole in one step: past the spare rows it is prefilled
                        want = rows <= spare and ProjectAdmission(project, 4096, None).admitted_prompts(
                            requests, [rows], requests, step_ms, prefill_ms, tau, value, dearer_ms=0.0) == 1
                        got = admits(rows, spare, requests, tau, value, step_ms, prefill_ms)
                        grid_equal &= got == want
                        grid_admitted += int(got)
    out["admits_equal_project"], out["admits_count"] = grid_equal, grid_admitted
    plateau_budget = BudgetSettings(N, curve=curve)
    policy = EntryAdmission(AdmissionSettings(64, 16 * 33), plateau_budget)
    out["decide_before_any_step"] = policy.decide(64, 16)
    policy.tau, policy.tail = torch.tensor(2.5), torch.tensor(0.03)
    rows16 = plateau_budget.rows_for(16)
    out["decide_equal"] = all(
        policy.decide(r, 16) == admits(r, rows16 - 16, 16, 2.5, float(torch.tensor(0.03)),
                                       project.at(rows16), project.at(r)) for r in (8, 64, 100, 112, 113))
    out["decide_64"] = policy.decide(64, 16)

    # make_room: the budget's lowest nodes give way, the shares stay best-first prefixes
    cut = SharedBudget(BudgetSettings(N, rows=B + 40)).share(step, anchor, prefix, torch.arange(B))
    roomy = make_room(cut, anchor, prefix, 10)
    direct = project_shares(step.tree.scores, 30)
    out["room"] = {"nodes": int(roomy.tree.num_nodes.sum()), "equal_fewer_nodes": bool(torch.equal(roomy.tree.num_nodes, direct))}

    # the mixed verify: the chunk after the trees, against brute force
    trees = RaggedTreeVerify.from_step(roomy, prefix)
    window_slots = torch.arange(B * (N + 1)).view(B, N + 1) + 1000
    pool_rows = torch.tensor([4, 9, 1, 6, 2, 8])
    chunk = Segment(pool_index=5, start=7, tokens=torch.randint(0, V, (10,)), slots=torch.arange(10) + 50)
    mixed = MixedVerify.build(trees, window_slots.reshape(-1)[trees.columns], pool_rows, prefix, chunk, 33)
    rows_t = int(trees.verify_lens.sum())
    chunk_mask = torch.cat([torch.cat([torch.ones(7, dtype=torch.bool), torch.arange(10) <= i]) for i in range(10)])
    packed = torch.randn(rows_t + 10, 3)
    head, tail = mixed.split(packed)
    layout = mixed.layout(torch.device("cpu"))
    fake = types.SimpleNamespace(req_pool_indices=pool_rows, seq_lens=prefix, seq_lens_cpu=prefix.clone(),
                                 seq_lens_sum=int(prefix.sum()))
    mixed.enter(fake)
    entered = (fake.req_pool_indices.tolist(), fake.seq_lens.tolist(), fake.seq_lens_sum)
    mixed.leave(fake)
    out["mixed"] = {
        "lens_ok": mixed.verify_lens.tolist() == trees.verify_lens.tolist() + [10],
        "tokens_ok": bool(torch.equal(mixed.tokens, torch.cat([trees.tokens, chunk.tokens]))),
        "positions_ok": mixed.positions[rows_t:].tolist() == list(range(7, 17))
                        and bool(torch.equal(mixed.positions[:rows_t], trees.positions)),
        "mask_ok": bool(torch.equal(mixed.custom_mask, torch.cat([trees.custom_mask, chunk_mask]))),
        "slots_ok": mixed.slots.tolist() == window_slots.reshape(-1)[trees.columns].tolist() + list(range(50, 60)),
        "batch_ok": mixed.req_pool_indices.tolist() == pool_rows.tolist() + [5]
                    and mixed.seq_lens.tolist() == prefix.tolist() + [7],
        "read_extent": mixed.read_extent,
        "split_ok": bool(torch.equal(head, packed[:rows_t]) and torch.equal(tail, packed[rows_t:])),
        "unpack_ok": bool(torch.equal(mixed.unpack(packed, fill=-1.0), trees.unpack(packed[:rows_t], fill=-1.0))),
        "layout_ok": layout.qo_indptr_device.tolist() == [0] + np.cumsum(mixed.verify_lens.tolist()).tolist(),
        "enter_ok": entered == (pool_rows.tolist() + [5], prefix.tolist() + [7], int(prefix.sum()) + 7),
        "leave_ok": fake.req_pool_indices is pool_rows and fake.seq_lens is prefix,
    }

    # the scheduler's hand-off, on stand-ins of its objects
    def scheduler(admission, prefix_len, extend_end, prompt_len, chunk_size=64):
        req = types.SimpleNamespace(prefix_len=prefix_len, extend_end=extend_end, origin_input_ids=[0] * prompt_len,
                                    kv=types.SimpleNamespace(req_pool_idx=3), inflight_middle_chunks=1)
        pool = types.SimpleNamespace(req_to_token=torch.arange(8 * 600).view(8, 600))
        worker = types.SimpleNamespace(_specpilot_tree=types.SimpleNamespace(admission=admission))
        new = types.SimpleNamespace(reqs=[req], input_ids=torch.arange(prefix_len, extend_end) + 7)
        running = types.SimpleNamespace(is_empty=lambda: False, batch_size=lambda: 16)
        return types.SimpleNamespace(draft_worker=worker, chunked_req=req, req_to_token_pool=pool,
                                     chunked_prefill_size=chunk_size), new, running, req

    sched, new, running, req = scheduler(None, 64, 128, 512)
    out["hand_off_unset"] = hand_off(sched, new, running) is new and not hasattr(running, "specpilot_segment")
    sched, new, running, req = scheduler(policy, 64, 128, 512)
    rode = hand_off(sched, new, running) is None
    got = running.specpilot_segment
    out["hand_off_middle"] = (rode and got.pool_index == 3 and got.start == 64 and got.rows == 64
                              and got.slots.tolist() == list(range(3 * 600 + 64, 3 * 600 + 128))
                              and got.tokens.tolist() == list(range(71, 135)) and req.inflight_middle_chunks == 0)
    cases = {"last_chunk": scheduler(policy, 448, 512, 512), "over_segment": scheduler(policy, 0, 96, 512, 96),
             "not_chunked": scheduler(policy, 0, 64, 512)}
    cases["not_chunked"][0].chunked_req = None
    out["hand_off_prefills"] = {k: hand_off(s_, n_, r_) is n_ and r_.specpilot_segment is None
                                for k, (s_, n_, r_, _) in cases.items()}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def probe(sglang_entries_export, tmp_path_factory):
    from specpilot_mem.batching.costs import StepCosts

    export, order = sglang_entries_export
    assert "shared-budget" in order, "entries/shared-budget is missing from the memory"
    standin = write_torchvision_standin(tmp_path_factory.mktemp("standin"))
    models = write_models(tmp_path_factory.mktemp("models"))
    measured = json.loads(open("benchmarks/results/batched-costs-h200-2026-12-02.json").read())
    costs = models / "c-of-r.json"
    costs.write_text(json.dumps(StepCosts.from_measurement(measured, "4b").target.to_dict()))
    drafter = models / "drafter-c-of-r.json"
    drafter.write_text(json.dumps(StepCosts.from_measurement(measured, "4b").drafter.to_dict()))
    env = {**import_environment(export, standin), "TORCHDYNAMO_DISABLE": "1", "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.getcwd()])  # the project's policies to compare with
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(models), str(costs), str(drafter)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, f"probe failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_flags_unset_resolve_as_before(probe):
    assert probe["stock"] == {"rows": None, "costs": None, "window": 16}
    assert probe["tree_window"] == 33 and probe["shared"] == {"rows": 128, "window": 33}


@pytest.mark.parametrize(
    "case,flag,limit",
    [
        ("budget_below_requests", "--specpilot-shared-budget-rows", "16 requests in flight"),
        ("budget_without_request_cap", "--specpilot-shared-budget-rows", "--max-running-requests 128"),
        ("budget_over_buffers", "--specpilot-shared-budget-rows", "(66:"),
        ("budget_without_trees", "--specpilot-shared-budget-rows", "--specpilot-tree-nodes"),
        ("budget_zero", "--specpilot-shared-budget-rows", "0 rows"),
        ("rows_and_costs", "--specpilot-shared-budget-rows", "--specpilot-shared-budget-costs"),
        ("costs_unreadable", "--specpilot-shared-budget-costs", "c(R)"),
    ],
)
def test_bad_budget_flags_are_refused_while_parsing(probe, case, flag, limit):
    refused = probe["refused"][case]
    assert refused is not None, f"{case} was accepted"
    assert refused["flag"] == flag and refused["message"].startswith(flag) and "Fix:" in refused["message"]
    assert limit in refused["message"]


def test_shares_equal_the_project_policy_and_the_replay(probe):
    shares = probe["shares"]
    for nodes, got in shares.items():
        assert got["equal_project"] and got["cut_equal_replay"] and got["layout_equal"], (nodes, got)
        assert got["total"] == min(int(nodes), 6 * 32)
    assert shares["40"]["uneven"] > 0  # the budget went where the scores are, not evenly
    assert probe["compact_full_is_identity"]


def test_plateau_budget_equals_the_cost_curve(probe):
    assert probe["plateau_equal"]
    assert probe["plateau_rows"] == probe["plateau_rows_project"]
    assert probe["plateau_rows"]["16"] > 16  # rows past the roots are free on the measured plateau


def test_ragged_verify_equals_brute_force(probe):
    ragged = probe["ragged"]
    assert ragged["total_rows"] == 46
    assert all(ragged[k] for k in ragged if k != "total_rows"), ragged


def test_acceptance_on_cut_trees(probe):
    assert probe["accept_equal"] and probe["accept_0"] == probe["deepest_0"] >= 2


def test_start_up(probe):
    assert probe["decoder_without_budget"]
    assert "--attention-backend triton" in probe["triton_refused"]
    assert probe["flashinfer_rows"] == {"1": 33, "16": 128}
    assert "hybrid" in probe["hybrid_refused"]


@pytest.mark.parametrize(
    "case,flag,limit",
    [
        ("block_over_drafted", "--specpilot-drafter-blocks", "1..16 positions"),
        ("block_zero", "--specpilot-drafter-blocks", "block 0"),
        ("blocks_not_numbers", "--specpilot-drafter-blocks", "comma-separated"),
        ("blocks_without_budget", "--specpilot-drafter-blocks", "--specpilot-shared-budget-rows"),
        ("blocks_without_costs", "--specpilot-drafter-costs", "c(R)"),
        ("costs_without_blocks", "--specpilot-drafter-costs", "--specpilot-drafter-blocks"),
    ],
)
def test_bad_block_flags_are_refused_while_parsing(probe, case, flag, limit):
    refused = probe["refused_blocks"][case]
    assert refused is not None, f"{case} was accepted"
    assert refused["flag"] == flag and refused["message"].startswith(flag) and "Fix:" in refused["message"]
    assert limit in refused["message"]


def test_block_choice_equals_the_project_policy(probe):
    assert probe["blocks"] == "16,12,8"
    assert probe["blocks_equal_project"] and probe["blocks_shrunk"] > 0


def test_block_state_follows_each_slot(probe):
    state = probe["state"]
    assert state["recent_ok"] and state["fit_rows_ok"]
    # with a plateau of 13 rows per request, the request that accepted 8 keeps its 16-block longest
    assert state["second"][1] == max(state["second"]) and min(state["second"]) < 16


def test_capped_shares(probe):
    assert probe["capped_shares_ok"] and probe["capped_confidence"]


def test_admission_flags(probe):
    assert probe["admission"] == {"stock": False, "on": True, "segment": 64}


@pytest.mark.parametrize(
    "case,flag,limit",
    [
        ("admission_without_budget", "--specpilot-prompt-admission", "--specpilot-shared-budget-rows"),
        ("segment_over_buffers", "--specpilot-prompt-segment", "1..127 rows"),
        ("segment_zero", "--specpilot-prompt-segment", "(128 rows"),
        ("segment_without_admission", "--specpilot-prompt-segment", "--specpilot-prompt-admission"),
        ("costs_budget_without_request_cap", "--specpilot-prompt-admission", "--max-running-requests"),
    ],
)
def test_bad_admission_flags_are_refused_while_parsing(probe, case, flag, limit):
    refused = probe["refused_admission"][case]
    assert refused is not None, f"{case} was accepted"
    assert refused["flag"] == flag and refused["message"].startswith(flag) and "Fix:" in refused["message"]
    assert limit in refused["message"]


def test_admission_decision_equals_the_project_policy(probe):
    assert probe["admits_equal_project"] and 0 < probe["admits_count"]
    assert probe["decide_before_any_step"] is False  # nothing has decoded yet: prefill as stock
    assert probe["decide_equal"] and probe["decide_64"] is True


def test_admitted_rows_displace_the_budgets_lowest_nodes(probe):
    assert probe["room"] == {"nodes": 30, "equal_fewer_nodes": True}


def test_mixed_verify_equals_brute_force(probe):
    mixed = probe["mixed"]
    assert mixed.pop("read_extent") == 33
    assert all(mixed.values()), mixed


def test_scheduler_hand_off(probe):
    assert probe["hand_off_unset"] and probe["hand_off_middle"]
    assert probe["hand_off_prefills"] == {"last_chunk": True, "over_segment": True, "not_chunked": True}
