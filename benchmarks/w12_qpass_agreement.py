"""Top-1 agreement of the Q pass (weights read from the W12 8-bit view) with the exact model.

The Q pass of two-level verification multiplies with the 8-bit view alone: the 4 dropped mantissa
bits at their midpoint (1000, the paper's choice) or truncated (0000). On a trained network, run
held-out text through the exact BF16 model and through the same model with every linear weight of its
blocks (and optionally its LM head) replaced by the Q-pass weight, and count the positions whose
argmax token agrees. Random weights or random activations are not comparable to the paper's 98.7%:
without the trained pair in models/ this prints status "pending" (``--synthetic`` runs the code on a
seeded random model, labelled synthetic).

    PYTHONPATH=kernels:. python benchmarks/w12_qpass_agreement.py [--device cuda] [--split unseen]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from torch import nn

from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.reference import qpass_weight_reference
from specpilot_mem.provenance import print_result, result_header


def qpass_copy(target: nn.Module, low_bits: str) -> nn.Module:
    """A copy of ``target`` whose block linear weights are the Q-pass weights of their W12 encoding."""
    quantized = copy.deepcopy(target)
    for module in quantized.blocks.modules():
        if isinstance(module, nn.Linear):
            weight = module.weight.data
            w12 = encode(weight.to(torch.bfloat16))
            module.weight.data = qpass_weight_reference(w12, low_bits).to(weight.dtype)
    return quantized


@torch.no_grad()
def agreement(target: nn.Module, tokens: torch.Tensor, low_bits: str, head: bool) -> dict:
    """Fraction of positions of ``tokens`` [B, T] where the Q-pass model's argmax equals the exact one."""
    exact_hidden, _ = target.forward_train(tokens)
    exact_top = (exact_hidden.float() @ target.lm_head_weight.float().t()).argmax(-1)
    quantized = qpass_copy(target, low_bits)
    q_hidden, _ = quantized.forward_train(tokens)
    head_weight = target.lm_head_weight
    if head:
        head_weight = qpass_weight_reference(encode(head_weight.to(torch.bfloat16)), low_bits)
    q_top = (q_hidden.float() @ head_weight.float().t()).argmax(-1)
    same = (q_top == exact_top).float()
    return {
        "low_bits": low_bits,
        "lm_head_on_view": head,
        "positions": int(same.numel()),
        "top1_agreement": same.mean().item(),
    }


def held_out_tokens(model_dir: Path, split: str, sequences: int, length: int) -> torch.Tensor:
    """``sequences`` windows of ``length`` tokens from the pinned corpus files of ``split``."""
    from tokenizers import Tokenizer

    from specpilot_mem.engine.train.corpus import read_pinned

    manifest = json.loads((model_dir / "corpus-manifest.json").read_text())
    texts, _ = read_pinned(manifest["files"])
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    stream = [i for text in texts[split] for i in tokenizer.encode(text).ids]
    if len(stream) < sequences * length:
        raise SystemExit(f"split {split!r} has {len(stream)} tokens, fewer than {sequences} x {length}")
    return torch.tensor(stream[: sequences * length]).view(sequences, length)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, default=Path(__file__).resolve().parents[1] / "models")
    parser.add_argument("--split", default="unseen")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--synthetic", action="store_true", help="seeded random model and tokens (code check only)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    from specpilot_mem.engine import TargetConfig
    from specpilot_mem.engine.model import HybridTarget
    from specpilot_mem.engine.weights import TARGET_FILE, load_target

    doc = {**result_header("w12_qpass_agreement"), "device_used": args.device}
    target_path = args.model_dir / TARGET_FILE
    if args.synthetic:
        torch.manual_seed(0)
        target = HybridTarget(TargetConfig()).to(args.device, torch.bfloat16).eval()
        tokens = torch.randint(0, target.cfg.vocab_size, (args.sequences, args.length))
        doc["weights"] = "synthetic: seeded random model and tokens, not comparable to a trained network"
    elif not target_path.exists():
        doc["status"] = "pending"
        doc["why"] = f"no trained target at {target_path}; random weights/activations are not comparable"
        print_result(doc, args.out)
        return
    else:
        target = load_target(target_path, device=args.device, dtype=torch.bfloat16)
        tokens = held_out_tokens(args.model_dir, args.split, args.sequences, args.length)
        doc["weights"] = f"trained: {target_path}"
        doc["split"] = args.split
    tokens = tokens.to(args.device)
    doc["results"] = [
        agreement(target, tokens, low_bits, head) for low_bits in ("midpoint", "truncated") for head in (False, True)
    ]
    print_result(doc, args.out)


if __name__ == "__main__":
    main()
