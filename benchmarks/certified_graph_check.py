"""The SGLang entry's certified head inside a captured CUDA graph, at SGLang's decode and verify row counts.

Runs the entry's own code (``sglang.srt.specpilot.certified_head`` from ``entries/certified-head/src`` with its
vendored kernels; ``scripts/device_stages/certified_graph.sh`` lays the package out, since SGLang itself does not
install on the GPU machine). Per row count: the head's one-hot logits are captured once in a ``torch.cuda.graph``
and replayed on two different inputs copied into the captured buffer; the replayed argmax must equal the exact
head's (the Triton exact head, whose arithmetic the rescore and the fallback share, lowest index on ties) on
adversarial inputs (near-tied rows, extreme norms) with zero rows among them, whose survivors overflow every list
and so take the in-graph full exact head. Where it differs from the BF16 head's argmax (stock), the two top BF16
logits must be equal. Then the graph's replay time against a graph of the BF16 head GEMM (cuBLAS), on inputs
without forced overflow. Synthetic weights (the adversarial head), made on the GPU.

    PYTHONPATH=<package>:kernels:. python benchmarks/certified_graph_check.py --out RESULT.json
"""

from __future__ import annotations

import argparse

import torch

from specpilot_mem.bench.cuda_timing import graph_replay_us, record_section
from specpilot_mem.provenance import print_result, result_header

ROWS = (1, 8, 32, 64, 128)


def capture(fn):
    """``fn`` captured in a CUDA graph after a warm-up on a side stream (as SGLang's runner does); returns its
    replay. Without CUDA (the dry run under the Triton interpreter) ``fn`` itself."""
    if not torch.cuda.is_available():
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=248320)
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()

    from sglang.srt.specpilot import certified_head as ch
    from sglang.srt.specpilot.kernels.certified_head import certified_argmax_graphable, exact_head_logits
    from sglang.srt.specpilot.kernels.certified_head.adversarial import adversarial_head, adversarial_inputs

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(0)
    weight, pairs = adversarial_head(args.vocab, args.hidden, gen)
    lm_head = torch.nn.Module()
    lm_head.weight = torch.nn.Parameter(weight, requires_grad=False)
    state = ch.certified_copy(lm_head, args.vocab)
    doc = {
        **result_header("certified_graph_check"),
        "synthetic": True,
        "label": "synthetic adversarial head (duplicates, near-duplicates, outlier rows), made on the GPU",
        "shape": {"vocab": args.vocab, "hidden": args.hidden},
        "max_survivors": ch.MAX_SURVIVORS,
        "cuda_pass": state.head.fragments is not None,
    }

    def check(rows: int) -> dict:
        x = torch.empty(rows, args.hidden, dtype=torch.bfloat16, device=dev)
        out = torch.empty(rows, args.vocab, dtype=torch.float32, device=dev)
        replay = capture(lambda: ch.certified_argmax_logits(state, x, args.vocab, out=out))
        result = {"overflow_rows": 0, "mismatches": 0, "bf16_differs": 0, "bf16_differs_not_tied": 0}
        for trial in range(2):  # a second input through the same graph: nothing baked in at capture
            inputs = adversarial_inputs(weight, pairs, rows, gen)
            inputs[trial::4] = 0  # every logit 0: every row survives, the list overflows, the fallback runs
            x.copy_(inputs)
            replay()
            tokens = out.argmax(1)
            exact = exact_head_logits(x, weight, exact="triton").argmax(1)
            _, count = certified_argmax_graphable(x[:32], state.head, max_survivors=ch.MAX_SURVIVORS, exact="triton")
            one_hot = bool(((out == 0).sum(1) == 1).all()) and bool(torch.isinf(out).sum() == rows * (args.vocab - 1))
            bf16 = (x @ weight.T).float()
            differs = bf16.argmax(1) != tokens
            tied = bf16.gather(1, tokens[:, None]).squeeze(1) == bf16.max(1).values
            result["overflow_rows"] += int((count > ch.MAX_SURVIVORS).sum())
            result["mismatches"] += int((tokens != exact).sum()) + (0 if one_hot else rows)
            result["bf16_differs"] += int(differs.sum())
            result["bf16_differs_not_tied"] += int((differs & ~tied).sum())
        del replay
        if not x.is_cuda:
            return result
        x.copy_(adversarial_inputs(weight, pairs, rows, gen))
        result["certified_us"] = graph_replay_us(
            lambda _: ch.certified_argmax_logits(state, x, args.vocab, out=out), replays=args.replays
        )
        logits = torch.empty(rows, args.vocab, dtype=torch.bfloat16, device=dev)
        result["bf16_head_us"] = graph_replay_us(lambda _: torch.mm(x, weight.T, out=logits), replays=args.replays)
        result["speedup_vs_bf16"] = result["bf16_head_us"] / result["certified_us"]
        return result

    for rows in args.rows:
        record_section(doc, f"rows_{rows}", lambda rows=rows: check(rows), args.out)
    checked = [doc[f"rows_{r}"] for r in args.rows if "error" not in doc[f"rows_{r}"]]
    doc["summary"] = {
        "row_counts_ok": len(checked),
        "row_counts": len(args.rows),
        "mismatches": sum(r["mismatches"] for r in checked),
        "bf16_differs_not_tied": sum(r["bf16_differs_not_tied"] for r in checked),
        "overflow_rows": sum(r["overflow_rows"] for r in checked),
        "speedup_vs_bf16": {r: doc[f"rows_{r}"].get("speedup_vs_bf16") for r in args.rows},
    }
    print_result(doc, args.out)


if __name__ == "__main__":
    main()
