"""Train the target, then the block drafter on the frozen target, in one seeded run (one H200 call).

Imports only torch, numpy and safetensors (via the engine), so it runs on the bare H200 with
``PYTHONPATH=kernels:.``; the corpus arrives pre-tokenized (``corpus.prepare``).

    python3 -m specpilot_mem.engine.train.train --tokens .g1data/corpus.npz --out models \
        --target-seconds 70 --rollout-seconds 15 --drafter-seconds 140

The drafter is distilled from the target's own greedy decoding, which is exactly what verification
accepts: each step mixes corpus blocks labelled by the target's argmax, each slot only while the
corpus has followed that argmax (``corpus_batch``: exact labels, varied contexts), with blocks of
greedy continuations of train-split prompts (rollouts: the contexts decoding itself produces, but
few enough that a drafter trained on them alone memorizes them). An argmax label past the first
point where the corpus departs from it would follow corpus tokens the drafter never sees.

A time budget picks the step count after a few timed warm-up steps, and the number of rollout rounds
(all logged, so ``--target-steps`` / ``--rollout-rounds`` / ``--drafter-steps`` reproduce a run
exactly); the learning rate follows a cosine over the steps.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specpilot_mem.engine import weights
from specpilot_mem.engine.config import DrafterConfig, TargetConfig
from specpilot_mem.engine.drafter import BlockDrafter
from specpilot_mem.engine.model import HybridTarget

WARMUP_STEPS = 10  # timed to choose the step count from a time budget; also the LR warm-up
TIMING_FROM = 3


def batch_starts(stream_len: int, seq_len: int, batch: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, stream_len - seq_len - 1, (batch,), generator=generator)


def take(stream: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    return stream[starts[:, None] + torch.arange(length, device=stream.device)[None]]


def lr_at(step: int, total: int, peak: float) -> float:
    if step < WARMUP_STEPS:
        return peak * (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, total - WARMUP_STEPS))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def target_loss(model: HybridTarget, tokens: torch.Tensor) -> torch.Tensor:
    hidden, _ = model.forward_train(tokens[:, :-1])
    logits = hidden @ model.lm_head_weight.t()
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@dataclass
class Rollouts:
    """Greedy continuations of the frozen target. tokens [N, T]: a corpus prompt of ``prompt_len``
    tokens, then the target's greedy tokens; features [N, T, feature_dim]: the target's drafter
    features at every position (teacher-forced over the whole sequence)."""

    tokens: torch.Tensor
    features: torch.Tensor
    prompt_len: int


@torch.no_grad()
def greedy_rollouts(
    target: HybridTarget, stream: torch.Tensor, count: int, prompt_len: int, new_tokens: int, generator: torch.Generator
) -> Rollouts:
    """``count`` prompts at random offsets of ``stream``, each continued by ``new_tokens`` greedy tokens.

    Whole-sequence passes per token (no cache: forward_train is batched, the engine's cache is not)."""
    device = stream.device
    tokens = take(stream, batch_starts(stream.numel(), prompt_len, count, generator).to(device), prompt_len)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for _ in range(new_tokens):
            hidden, _ = target.forward_train(tokens)
            nxt = (hidden[:, -1] @ target.lm_head_weight.t()).float().argmax(-1)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        _, features = target.forward_train(tokens)
    return Rollouts(tokens, features, prompt_len)


def rollout_pool(
    target: HybridTarget,
    stream: torch.Tensor,
    round_size: int,
    prompt_len: int,
    new_tokens: int,
    rounds: int | None,
    seconds: float,
    generator: torch.Generator,
    log: list,
) -> Rollouts:
    """Rounds of ``round_size`` rollouts: ``rounds`` of them, or as many as fit in ``seconds`` (at least one)."""
    start = time.perf_counter()
    parts: list[Rollouts] = []
    while len(parts) < (rounds if rounds is not None else len(parts) + 1):
        parts.append(greedy_rollouts(target, stream, round_size, prompt_len, new_tokens, generator))
        if stream.is_cuda:
            torch.cuda.synchronize()
        if rounds is None and time.perf_counter() - start >= seconds:
            break
    pool = Rollouts(torch.cat([p.tokens for p in parts]), torch.cat([p.features for p in parts]), prompt_len)
    entry = {
        "phase": "rollouts",
        "event": "rounds",
        "rounds": len(parts),
        "sequences": pool.tokens.shape[0],
        "greedy_tokens": pool.tokens.shape[0] * new_tokens,
        "elapsed_s": round(time.perf_counter() - start, 2),
    }
    log.append(entry)
    print(json.dumps(entry), flush=True)
    return pool


def drafter_batch(pool: Rollouts, cfg: DrafterConfig, rows: int, anchors_per_seq: int, generator: torch.Generator):
    """Drafter inputs and labels from ``rows`` rollouts of the pool, ``anchors_per_seq`` blocks each.

    An anchor is a committed token at or after the prompt's last one, so each of its block's labels
    (the next ``block_size`` tokens) is a greedy token of the target. Returns (features [N, W, F],
    valid [N, W], anchors [N], anchor_pos [N], labels [N, block_size], labelled [N, block_size] bool,
    all true here) with N = rows * anchors_per_seq.
    """
    device = pool.tokens.device
    N, T = pool.tokens.shape
    seq = torch.randint(0, N, (rows, 1), generator=generator).to(device)
    anchor_pos = torch.randint(
        pool.prompt_len - 1, T - cfg.block_size, (rows, anchors_per_seq), generator=generator
    ).to(device)
    ctx = anchor_pos[..., None] - cfg.context_window + torch.arange(cfg.context_window, device=device)
    valid = ctx >= 0
    features = pool.features[seq[..., None], ctx.clamp(min=0)]
    labels = pool.tokens[seq[..., None], anchor_pos[..., None] + 1 + torch.arange(cfg.block_size, device=device)]
    flat = lambda x: x.reshape(rows * anchors_per_seq, *x.shape[2:])  # noqa: E731
    labels = flat(labels)
    return (
        flat(features),
        flat(valid),
        flat(pool.tokens[seq, anchor_pos]),
        flat(anchor_pos),
        labels,
        torch.ones_like(labels, dtype=torch.bool),
    )


@torch.no_grad()
def corpus_batch(
    target: HybridTarget, cfg: DrafterConfig, tokens: torch.Tensor, anchors_per_seq: int, generator: torch.Generator
):
    """Drafter blocks on corpus sequences ``tokens`` [B, T], labelled by the frozen target's argmax.

    Slot j's label, the target's argmax after the corpus token at anchor + j, is the target's greedy
    continuation only if the corpus followed that argmax at every earlier slot; elsewhere slot j is
    left unlabelled. So every label is exact and contexts come from the whole train split (far more
    varied than the rollouts, which a drafter memorizes). Returns what ``drafter_batch`` returns.
    """
    B, T = tokens.shape
    device = tokens.device
    hidden, feats = target.forward_train(tokens)
    greedy = (hidden @ target.lm_head_weight.t()).argmax(-1)  # greedy[t]: the target's next token after t
    follows = tokens[:, 1:] == greedy[:, :-1]  # follows[t]: token t + 1 is the target's argmax after t
    anchor_pos = torch.randint(1, T - cfg.block_size, (B, anchors_per_seq), generator=generator).to(device)
    rows = torch.arange(B, device=device)[:, None, None]
    ctx = anchor_pos[..., None] - cfg.context_window + torch.arange(cfg.context_window, device=device)
    valid = ctx >= 0
    slots = anchor_pos[..., None] + torch.arange(cfg.block_size, device=device)
    on_path = follows[rows, slots[..., :-1]].int().cumprod(-1).bool()
    labelled = torch.cat([torch.ones_like(on_path[..., :1]), on_path], dim=-1)
    flat = lambda x: x.reshape(B * anchors_per_seq, *x.shape[2:])  # noqa: E731
    return (
        flat(feats[rows, ctx.clamp(min=0)]),
        flat(valid),
        flat(tokens[rows[..., 0], anchor_pos]),
        flat(anchor_pos),
        flat(greedy[rows, slots]),
        flat(labelled),
    )


def drafter_loss(target: HybridTarget, drafter: BlockDrafter, batch, slot_decay: float = 0.9, block: int | None = None):
    """Block CE on the base logits plus CE of the selector-conditioned logits given the previous label.
    Slots without a label (``labelled`` false) take no part. ``block``: masked positions in the forward (default
    the trained block), its labels the batch's first ``block``. Returns (loss, per-slot top-1 accuracy
    of the base logits over the labelled blocks [block])."""
    features, valid, anchors, anchor_pos, labels, labelled = batch
    if block is not None:
        labels, labelled = labels[:, :block], labelled[:, :block]
    hidden = drafter(target.embed, features, valid, anchors, anchor_pos, block=block)  # [N, S, d]
    base = (hidden @ target.lm_head_weight.t()).float()
    prev = torch.cat([anchors[:, None], labels[:, :-1]], dim=1)
    conditioned = base + drafter.pair_logits_full(hidden, prev)
    S = labels.shape[1]
    weights_ = slot_decay ** torch.arange(S, device=base.device, dtype=torch.float32)
    weights_ = weights_ / weights_.sum()
    ce_base = F.cross_entropy(base.reshape(-1, base.shape[-1]), labels.reshape(-1), reduction="none").view(-1, S)
    ce_cond = F.cross_entropy(conditioned.reshape(-1, base.shape[-1]), labels.reshape(-1), reduction="none").view(-1, S)
    mask = labelled.float()
    counts = mask.sum(0).clamp(min=1)
    loss = (((ce_base + ce_cond) * mask).sum(0) / counts * weights_).sum()
    return loss, ((base.argmax(-1) == labels).float() * mask).sum(0) / counts


@torch.no_grad()
def evaluate_target(model: HybridTarget, stream: torch.Tensor, seq_len: int, max_tokens: int) -> float:
    """Mean next-token loss (nats) over consecutive windows of the stream."""
    windows = min((stream.numel() - 1) // seq_len, max(1, max_tokens // seq_len))
    total, count = 0.0, 0
    for start in range(0, windows, 16):
        idx = torch.arange(start, min(start + 16, windows), device=stream.device) * seq_len
        tokens = take(stream, idx, seq_len + 1)
        with torch.autocast(stream.device.type, dtype=torch.bfloat16, enabled=stream.is_cuda):
            loss = target_loss(model, tokens)
        total += float(loss) * idx.numel()
        count += idx.numel()
    return total / count


@torch.no_grad()
def evaluate_drafter(target, drafter, pool: Rollouts, batches: int, generator, block: int | None = None) -> dict:
    """Per-slot top-1 accuracy of the base logits against the target's greedy continuation, and the
    chain-8 tau they give (accepted prefix + the target's own token) on held-out rollouts; ``block``: the
    forward's masked positions (default the trained block)."""
    accs, chains = [], []
    for _ in range(batches):
        with torch.autocast(pool.tokens.device.type, dtype=torch.bfloat16, enabled=pool.tokens.is_cuda):
            features, valid, anchors, anchor_pos, labels, _ = drafter_batch(pool, drafter.cfg, 8, 32, generator)
            hidden = drafter(target.embed, features, valid, anchors, anchor_pos, block=block)
            base = (hidden @ target.lm_head_weight.t()).float()
        hit = base.argmax(-1) == labels[:, : base.shape[1]]
        accs.append(hit.float().mean(0))
        chains.append(1 + hit[:, :8].int().cumprod(1).sum(1).float().mean())
    return {"slot_accuracy": torch.stack(accs).mean(0).tolist(), "chain8_tau_proxy": float(torch.stack(chains).mean())}


def run_phase(name, params, step_fn, steps: int | None, seconds: float, lr: float, log: list, device) -> int:
    """AdamW over ``params``; ``steps`` fixed, or chosen from ``seconds`` after the warm-up steps."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda")
    total = steps if steps is not None else WARMUP_STEPS + 1
    step, start = 0, time.perf_counter()
    while step < total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, lr)
        loss, extra = step_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if steps is None and step in (TIMING_FROM, WARMUP_STEPS):
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step == TIMING_FROM:  # the first steps pay for CUDA initialisation: time the later ones
                timing_start = time.perf_counter()
                continue
            per_step = (time.perf_counter() - timing_start) / (WARMUP_STEPS - TIMING_FROM)
            total = max(WARMUP_STEPS + 1, int((seconds - (time.perf_counter() - start)) / per_step) + WARMUP_STEPS)
            log.append({"phase": name, "event": "steps_chosen", "seconds_per_step": per_step, "steps": total})
        if step % 50 == 0 or step == total:
            entry = {
                "phase": name,
                "step": step,
                "loss": loss.item(),
                "elapsed_s": round(time.perf_counter() - start, 2),
            }
            if extra is not None:
                entry["slot_accuracy"] = [round(float(a), 4) for a in extra[:8]]
            log.append(entry)
            print(json.dumps(entry), flush=True)
    return total


def config_overrides(ap: argparse.ArgumentParser, cls, flag: str, text: str):
    """``cls`` with the fields of the JSON object ``text`` overridden; a malformed object or an unknown
    field stops the run before any work (a misspelt field would otherwise train the default silently)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        ap.error(f"{flag} is not JSON ({err}); pass an object such as '{{\"d_model\": 128}}'")
    if not isinstance(data, dict):
        ap.error(f"{flag} must be a JSON object of {cls.__name__} fields")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        ap.error(f"{flag} has no field {', '.join(unknown)}; {cls.__name__} fields: {', '.join(sorted(known))}")
    return cls.from_json(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=Path, required=True, help="corpus.npz from corpus.prepare")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="sequences per target step, rollouts per drafter step")
    ap.add_argument("--target-steps", type=int)
    ap.add_argument("--target-seconds", type=float, default=70)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--prompt-len", type=int, default=64, help="corpus tokens before each greedy rollout")
    ap.add_argument("--rollout-tokens", type=int, default=128, help="greedy tokens per rollout")
    ap.add_argument("--rollout-batch", type=int, default=512, help="rollouts per round")
    ap.add_argument("--rollout-rounds", type=int)
    ap.add_argument("--rollout-seconds", type=float, default=15)
    ap.add_argument(
        "--rollout-rows", type=int, default=16, help="rollouts per drafter step (besides --batch corpus sequences)"
    )
    ap.add_argument("--drafter-steps", type=int)
    ap.add_argument("--drafter-seconds", type=float, default=140)
    ap.add_argument("--drafter-lr", type=float, default=2e-3)
    ap.add_argument("--anchors", type=int, default=16, help="drafter blocks per rollout")
    ap.add_argument(
        "--drafter-blocks",
        default="",
        help="masked positions per forward to train on, one drawn per step (e.g. 16,12,8: a per-request drafter "
        "block drafts them; default the trained block only)",
    )
    ap.add_argument("--eval-tokens", type=int, default=400_000)
    ap.add_argument("--target-config", default="{}", help="JSON overrides of TargetConfig fields")
    ap.add_argument("--drafter-config", default="{}", help="JSON overrides of DrafterConfig fields")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument(
        "--init-from", type=Path, help="continue from the pair in this folder (its configs win; its log is kept)"
    )
    ap.add_argument(
        "--new-drafter", action="store_true", help="with --init-from: a fresh drafter (--drafter-config) on its target"
    )
    args = ap.parse_args(argv)
    drafter_cfg = config_overrides(ap, DrafterConfig, "--drafter-config", args.drafter_config)
    target_cfg = config_overrides(ap, TargetConfig, "--target-config", args.target_config)
    if args.rollout_tokens <= drafter_cfg.block_size:
        ap.error(
            f"--rollout-tokens {args.rollout_tokens} must exceed the drafter's block ({drafter_cfg.block_size}) to label a block"
        )
    try:
        train_blocks = [int(b) for b in args.drafter_blocks.split(",") if b]
    except ValueError:
        ap.error(f"--drafter-blocks {args.drafter_blocks!r}: give block sizes as integers, e.g. 16,12,8")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    data = np.load(args.tokens)
    streams = {s: torch.from_numpy(data[s].astype(np.int64)).to(device) for s in ("train", "dev", "unseen")}
    earlier: list[dict] = []
    if args.init_from:
        target = weights.load_target(args.init_from / weights.TARGET_FILE, device)
        target_cfg = target.cfg
        if args.new_drafter:
            drafter = BlockDrafter(drafter_cfg, target_cfg).to(device)
        else:
            drafter = weights.load_drafter(args.init_from / weights.DRAFTER_FILE, target_cfg, device)
            drafter_cfg = drafter.cfg
        for p in (*target.parameters(), *drafter.parameters()):
            p.requires_grad_(True)
        earlier = json.loads((args.init_from / "training-log.json").read_text())
    else:
        target = HybridTarget(target_cfg).to(device)
        drafter = BlockDrafter(drafter_cfg, target_cfg).to(device)
    bad = [b for b in train_blocks if not 1 <= b <= drafter_cfg.block_size]
    if bad:
        ap.error(f"--drafter-blocks: block {bad[0]} cannot be drafted: the drafter drafts 1..{drafter_cfg.block_size}")
    log: list[dict] = earlier + [
        {
            "event": "start",
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "args": {k: str(v) for k, v in vars(args).items()},
            "target_params": sum(p.numel() for p in target.parameters()),
            "drafter_params": sum(p.numel() for p in drafter.parameters()),
            "train_tokens": int(streams["train"].numel()),
        }
    ]
    print(json.dumps(log[len(earlier)]), flush=True)
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")  # noqa: E731

    def target_step():
        tokens = take(
            streams["train"],
            batch_starts(streams["train"].numel(), args.seq_len + 1, args.batch, gen).to(device),
            args.seq_len + 1,
        )
        with autocast():
            return target_loss(target, tokens), None

    t0 = time.perf_counter()
    target.train()
    target_steps = run_phase(
        "target",
        list(target.parameters()),
        target_step,
        args.target_steps,
        args.target_seconds,
        args.target_lr,
        log,
        device,
    )
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    pool = rollout_pool(
        target,
        streams["train"],
        args.rollout_batch,
        args.prompt_len,
        args.rollout_tokens,
        args.rollout_rounds,
        args.rollout_seconds,
        gen,
        log,
    )

    def drafter_step():
        tokens = take(
            streams["train"],
            batch_starts(streams["train"].numel(), args.seq_len, args.batch, gen).to(device),
            args.seq_len,
        )
        # one block per step (its forward's shape), drawn from --drafter-blocks; its loss reads that many slots
        block = train_blocks[int(torch.randint(len(train_blocks), (1,), generator=gen))] if train_blocks else None
        with autocast():
            corpus = corpus_batch(target, drafter_cfg, tokens, args.anchors, gen)
            rolled = drafter_batch(pool, drafter_cfg, args.rollout_rows, args.anchors, gen)
            return drafter_loss(target, drafter, tuple(torch.cat(pair) for pair in zip(corpus, rolled)), block=block)

    drafter.train()
    drafter_steps = run_phase(
        "drafter",
        list(drafter.parameters()),
        drafter_step,
        args.drafter_steps,
        args.drafter_seconds,
        args.drafter_lr,
        log,
        device,
    )
    drafter.eval()
    train_seconds = time.perf_counter() - t0

    # Evaluate what the saved (bf16) weights give, as the engine loads them.
    args.out.mkdir(parents=True, exist_ok=True)
    before = next((e for e in reversed(earlier) if e.get("event") == "done"), {})
    target_steps += before.get("target_steps", 0)
    drafter_steps += 0 if args.new_drafter else before.get("drafter_steps", 0)
    meta = {
        "seed": args.seed,
        "target_steps": target_steps,
        "drafter_steps": drafter_steps,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "label": "small models trained here",
    }
    weights.save_module(target, args.out / weights.TARGET_FILE, target_cfg.to_json(), meta)
    weights.save_module(drafter, args.out / weights.DRAFTER_FILE, drafter_cfg.to_json(), meta)
    target = weights.load_target(args.out / weights.TARGET_FILE, device)
    drafter = weights.load_drafter(args.out / weights.DRAFTER_FILE, target_cfg, device)
    evals = {
        f"{s}_loss_nats": evaluate_target(target, streams[s], args.seq_len, args.eval_tokens)
        for s in ("train", "dev", "unseen")
    }
    eval_gen = torch.Generator().manual_seed(args.seed + 1)
    held_out = greedy_rollouts(target, streams["unseen"], 64, args.prompt_len, args.rollout_tokens, eval_gen)
    evals["unseen_drafter"] = evaluate_drafter(target, drafter, held_out, 8, eval_gen)
    for block in sorted(set(train_blocks) - {drafter_cfg.block_size}, reverse=True):
        evals[f"unseen_drafter_block{block}"] = evaluate_drafter(target, drafter, held_out, 8, eval_gen, block)
    summary = {
        "event": "done",
        "train_seconds": round(train_seconds, 1),
        "target_steps": target_steps,
        "drafter_steps": drafter_steps,
        **evals,
    }
    log.append(summary)
    print(json.dumps(summary), flush=True)
    (args.out / "training-log.json").write_text(json.dumps(log, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
