"""Prompt admission in the composed engine, on the trained pair (CPU, float32): a prompt segment in a verify step's
forward (``SystemModel.step_with_segments``) commits bit for bit what a prefill pass of its rows commits, beside
the step's own requests, which commit bit for bit what the step alone commits; the batched decoder with admission
(``PolicyDecoder``, config ``prompt-admission``) decodes the greedy output, admits only on the plateau, and token
forcing finds nothing to reject; bad segments are refused with the flag and the limit."""

import copy

import pytest
import torch

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.costs import BatchingError, CostCurve, StepCosts
from specpilot_mem.batching.simulate import CONFIGS
from specpilot_mem.batching.system_decoder import PolicyDecoder
from specpilot_mem.engine import weights
from specpilot_mem.engine.decode import SystemDecoder
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.options import OptionsError, SystemOptions
from specpilot_mem.engine.system import StepBuffers, pack_trees

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(not weights.has_trained_pair(), reason="needs the trained pair in models/"),
]

NEW_TOKENS = 16
PROMPT = list(b"import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser(description=")
# Three requests' 17-row chains (51 rows) sit on a plateau that ends at 96 rows: 45 spare rows, two 16-row
# segments per step. A curve rising at every row leaves none (compute does not idle).
PLATEAU = CostCurve((1, 16, 32, 48, 64, 96, 128, 2048), (1.0, 1.0, 1.01, 1.02, 1.03, 1.04, 3.0, 48.0), "plateau")
RISING = CostCurve((1, 2, 4, 8, 16, 32, 64, 128, 2048), (1, 2, 4, 8, 16, 32, 64, 128, 2048), "no plateau")


@pytest.fixture(scope="module")
def engine():
    return Engine.load_default()


@pytest.fixture(scope="module")
def prompts():
    return [PROMPT[i : i + 40] for i in range(0, 20, 4)]


@pytest.fixture(scope="module")
def ar(engine, prompts):
    return SystemDecoder(engine, batch=1, max_len=256).generate(prompts, "ar", NEW_TOKENS)


def caches_equal(a, b) -> bool:
    tensors = [(a.lengths, b.lengths), (a.state_all, b.state_all), (a.conv_all, b.conv_all)]
    tensors += [(a.k[i], b.k[i]) for i in a.k] + [(a.v[i], b.v[i]) for i in a.v] + [(a.features, b.features)]
    return all(torch.equal(x, y) for x, y in tensors)


@pytest.mark.parametrize("gdn_verify, tree", [("snapshot", "chain"), ("path", "best-first")])
def test_a_segment_commits_what_a_prefill_pass_of_its_rows_commits(engine, prompts, gdn_verify, tree):
    options = SystemOptions(gdn_verify=gdn_verify, tree=tree, nodes=16, positions=16)
    decoder = SystemDecoder(engine, options, batch=3, max_len=256)
    anchors = [decoder.prefill(slot, prompts[slot]) for slot in range(2)]
    reference = copy.deepcopy(decoder.caches)
    B, T = 3, decoder.options.rows
    prompt, start = prompts[2], 0
    decoder.caches.reset(2)
    reference.reset(2)
    for rows, width in ((16, 16), (16, 16), (8, 16)):  # the last segment padded to the segment's width
        trees = decoder.draft_trees(anchors, [0, 1])
        buf = StepBuffers.empty(B, T, decoder.weights.shape.conv_size, decoder.device)
        buf.fill(pack_trees(trees + [([0], [-1])], T, decoder.weights.shape.conv_size))
        buf.active.copy_(torch.tensor([True, True, False]))
        buf.out_len.copy_(torch.tensor([1, 1, 0]))
        segment = decoder.prompt_segment(prompt, start, rows, width)
        out, lens, seg_out = decoder.model.step_with_segments(buf, decoder.caches, [(segment, decoder.caches.view(2))])
        alone, alone_lens = decoder.model.step(buf, reference)
        pass_out, pass_lens = decoder.prefill_model.step(
            decoder.prompt_segment(prompt, start, rows, width), reference.view(2)
        )
        assert torch.equal(out, alone) and torch.equal(lens, alone_lens)
        assert torch.equal(seg_out[0], pass_out) and int(pass_lens[0]) == rows
        assert caches_equal(decoder.caches, reference)
        anchors = [int(out[b, int(lens[b]) - 1]) for b in range(2)]
        start += rows
    # the segment that ends the prompt gives its first output token: the greedy one
    first = SystemDecoder(engine, batch=1, max_len=256).generate([prompt], "ar", 1)[0].output_ids[0]
    assert int(seg_out[0][0, 7]) == first


@pytest.mark.parametrize("segment", [16, None])
def test_the_decoder_with_admission_decodes_the_greedy_output(engine, prompts, ar, segment):
    costs = StepCosts("test", PLATEAU, PLATEAU, 0.0, measured=False)
    decoder = PolicyDecoder(engine, CONFIGS["prompt-admission"], costs, batch=3, max_len=256, segment=segment)
    runs = decoder.generate(prompts, "spec", NEW_TOKENS)
    for got, want in zip(runs, ar):
        assert got.output_ids == want.output_ids  # float32 on one CPU: the greedy decode itself
    entered = [decoder.admitted[str(r)] for r in range(len(prompts))]
    # the first three prompts find nothing decoding and are prefilled on their own; the later two enter in the
    # verify steps, whole segments (or one chain of the spare rows) at a time, never past the plateau
    assert all(chunks == [(40, -1)] for chunks in entered[:3])
    for chunks in entered[3:]:
        assert sum(rows for rows, _ in chunks) == 40 and all(width > 0 for _, width in chunks)
        if segment:
            assert all(width % segment == 0 for _, width in chunks) and len(chunks) >= 2
    spare = PLATEAU.plateau_end(3 * decoder.options.rows) - 3 * decoder.options.rows
    assert all(width <= spare for chunks in entered for _, width in chunks)


def test_no_rows_are_admitted_when_compute_does_not_idle(engine, prompts, ar):
    costs = StepCosts("test", RISING, RISING, 0.0, measured=False)
    decoder = PolicyDecoder(engine, CONFIGS["prompt-admission"], costs, batch=3, max_len=256, segment=16)
    runs = decoder.generate(prompts, "spec", NEW_TOKENS)
    assert [g.output_ids for g in runs] == [g.output_ids for g in ar]
    assert all(chunks == [(40, -1)] for chunks in decoder.admitted.values())


def test_token_forcing_accepts_admission(engine, prompts, ar):
    from specpilot_mem.controller.requests import Request as ForcingRequest
    from specpilot_mem.controller.system import RequestOutput
    from specpilot_mem.forcing.engine_adapter import EngineScorer
    from specpilot_mem.forcing.scorer import score_outputs
    from specpilot_mem.forcing.verdict import TokenForcing

    costs = StepCosts("test", PLATEAU, PLATEAU, 0.0, measured=False)
    runs = PolicyDecoder(engine, CONFIGS["prompt-admission"], costs, batch=3, max_len=256, segment=16).generate(
        prompts, "spec", NEW_TOKENS
    )
    ids = [f"p{r}" for r in range(len(prompts))]
    requests = [ForcingRequest(i, "code", "dev", NEW_TOKENS, prompt_ids=tuple(p)) for i, p in zip(ids, prompts)]

    def outputs(generations):
        return {i: RequestOutput(i, tuple(g.output_ids), 0.0, tuple(g.token_times)) for i, g in zip(ids, generations)}

    scorer = EngineScorer(engine)
    stock = score_outputs(scorer, requests, outputs(ar))
    verdict = TokenForcing(scorer, stock, delta=0.125).judge(
        "prompt-admission", score_outputs(scorer, requests, outputs(runs))
    )
    # nothing rejects; 80 tokens are too few to accept (benchmarks/admission_forcing.py runs enough requests)
    assert verdict.verdict == "inconclusive" and len(verdict.reasons) == 1, verdict.reasons
    assert verdict.rate.system_rate == 0 and verdict.events.system_events == 0


def test_bad_segments_are_refused_with_the_flag_and_the_limit(engine, prompts):
    costs = StepCosts("test", PLATEAU, PLATEAU, 0.0, measured=False)
    with pytest.raises(BatchingError, match=r"--prompt-segment=4096 does not fit the verify buffers \(2048 rows\)"):
        PolicyDecoder(engine, CONFIGS["prompt-admission"], costs, batch=3, max_len=256, segment=4096)
    with pytest.raises(BatchingError, match="--prompt-segment=0"):
        PromptAdmission(PLATEAU, 2048, 0)
    with pytest.raises(BatchingError, match="prompt admission and the budget planner cannot be combined"):
        PolicyDecoder(engine, CONFIGS["all"], costs, batch=3, max_len=256)
    decoder = PolicyDecoder(engine, CONFIGS["prompt-admission"], costs, batch=3, max_len=256, segment=512)
    with pytest.raises(OptionsError, match=r"--prompt-segment=512 rows do not fit .*at most 239 rows"):
        decoder.generate(prompts, "spec", NEW_TOKENS)
    small = PolicyDecoder(engine, CONFIGS["prompt-admission"], costs, batch=3, max_len=256, segment=16)
    with pytest.raises(OptionsError, match="AR steps advance every slot's GDN state"):
        small.generate(prompts, "ar", NEW_TOKENS)
    assert small.caches.lengths.sum() == 0  # refused before anything ran
    flips = SystemDecoder(engine, SystemOptions(flip_rate=0.1), batch=3, max_len=256)
    with pytest.raises(OptionsError, match="flip fault"):
        flips.generate(prompts, "spec", NEW_TOKENS, admission=small.admission)
