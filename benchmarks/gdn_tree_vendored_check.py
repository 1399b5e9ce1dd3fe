"""The library's GDN tree kernels against the copy the gdn-tree entry vendors: same bits, same time.

The gdn-tree SGLang entry carries a copy of ``kernels/specpilot_kernels/gdn_tree`` (``entries/gdn-tree/delta.patch``,
pinned by sha256 in its record) until it is re-recorded; a change to the library that must not change what the
kernels compute (a refactor) is checked here against that copy:

- ``ptx`` (no GPU needed, run without ``TRITON_INTERPRET``): sha256 of each Triton kernel's sm_90 PTX for the
  specialisations the library launches (path verify with and without kept states, prefetch and prepared inputs; the
  commit over FP32 and bf16 pools; the WY verify; the schedule; the input preparation), library vs copy;
- ``bits`` (under the interpreter on a CPU, or on a GPU): schedule, path-verify outputs, committed states and WY
  outputs of both copies on the same random trees and inputs, compared bit for bit (Triton kernels: the CUDA lanes
  kernel is the same source in both);
- ``timing`` (GPU): each call by CUDA-graph replay, library vs copy, side by side.

    PYTHONPATH=kernels:. python benchmarks/gdn_tree_vendored_check.py --sections ptx [--out FILE]      # here
    TRITON_INTERPRET=1 PYTHONPATH=kernels:. python benchmarks/gdn_tree_vendored_check.py --sections bits --device cpu
    PYTHONPATH=kernels:. python benchmarks/gdn_tree_vendored_check.py --sections bits,timing --out FILE  # on the GPU
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gdn_tree_bench import (  # noqa: E402
    deepest_root_paths,
    make_inputs,
    path_kernel_types,
    random_tree,
    sm90_ptx_sha256,
)
from specpilot_mem.bench.cuda_timing import graph_replay_us, record_section  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

PATCH = ROOT / "entries" / "gdn-tree" / "delta.patch"
RECORD = ROOT / "entries" / "gdn-tree" / "entry.yaml"
VENDORED = "sglang/srt/specpilot/kernels/"
COPY_PACKAGE = "gdn_tree_vendored_kernels"


def patch_new_files(patch: Path, prefix: str) -> dict[str, str]:
    """{path below ``prefix``: text} of every file the unified diff ``patch`` adds under ``prefix``."""
    files: dict[str, str] = {}
    current: list[str] | None = None
    for line in patch.read_text().splitlines(keepends=True):
        if line.startswith("diff --git "):
            current = None
        elif line.startswith("+++ b/") and line[6:].strip().startswith(prefix):
            current = files.setdefault(line[6:].strip()[len(prefix) :], [])
        elif current is not None and line.startswith("+"):
            current.append(line[1:])
    return {path: "".join(lines) for path, lines in files.items()}


def vendored_copy(dest: Path):
    """The entry's vendored ``gdn_tree`` package, written under ``dest`` as ``gdn_tree_vendored_kernels.gdn_tree``
    after checking every file against the record's sha256; returns (module, whether it differs from the library)."""
    pins = {}
    for line in RECORD.read_text().splitlines():
        name, _, digest = line.strip().partition(": ")
        if name.startswith(VENDORED) and len(digest) == 64:
            pins[name[len(VENDORED) :]] = digest
    files = patch_new_files(PATCH, VENDORED)
    for path, digest in pins.items():  # package markers (__init__.py) are written by the vendoring, not pinned
        if path not in files or hashlib.sha256(files[path].encode()).hexdigest() != digest:
            raise SystemExit(f"{PATCH}: {path} is not the copy {RECORD} pins; re-record gdn-tree or restore the patch")
    for path, text in files.items():
        out = dest / COPY_PACKAGE / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    (dest / COPY_PACKAGE / "__init__.py").touch()
    library = ROOT / "kernels" / "specpilot_kernels"
    differs = sorted(p for p, text in files.items() if (library / p).read_text() != text)
    sys.path.insert(0, str(dest))
    return importlib.import_module(f"{COPY_PACKAGE}.gdn_tree"), differs


def ptx_digests(package: str) -> dict[str, str]:
    """sm_90 PTX sha256 of each Triton kernel of ``package.gdn_tree`` per launched specialisation (entry shapes:
    H=16, HV=32, K=V=128, 32 nodes)."""
    pv = importlib.import_module(f"{package}.gdn_tree.path_verify")
    wy = importlib.import_module(f"{package}.gdn_tree.wy_verify")
    heads = dict(T=32, H=16, HV=32, K=128, V=128, BK=128)
    digests = {}
    for name, write_state, pool, prefetch, saved, prepared in (
        ("verify_kept8_prefetch", None, "fp32", True, 8, False),
        ("verify_kept8", None, "fp32", False, 8, False),
        ("verify_replay_prefetch", None, "fp32", True, 0, False),
        ("verify_kept8_prefetch_prepared", None, "fp32", True, 8, True),
        ("commit_fp32_prefetch", 1, "fp32", True, 0, False),
        ("commit_fp32", 1, "fp32", False, 0, False),
        ("commit_bf16_prefetch", 1, "bf16", True, 0, False),
    ):
        constants = dict(**heads, BV=4, USE_QK_L2NORM=True, MAX_SAVED=saved, PREFETCH=prefetch, PREPARED=prepared)
        if write_state is not None:
            constants["write_state"] = write_state
        types = path_kernel_types(pool)
        if prepared:
            types.update({name: "*fp32" for name in ("q", "k", "a", "b")})
        digests[name] = sm90_ptx_sha256(pv._path_verify_kernel, types, constants, num_warps=1, num_stages=3)
    i32 = ("parents", "num_nodes", "order", "replay_len", "replay", "restore_slot", "save_slot")
    for saved in (0, 8):
        digests[f"schedule_kept{saved}"] = sm90_ptx_sha256(
            pv._tree_schedule_kernel,
            dict.fromkeys(i32, "*i32"),
            dict(T=32, NP2_T=32, MAX_SAVED=saved, NP2_S=max(saved, 1)),
            num_warps=1,
            num_stages=3,
        )
    digests["prepare_inputs"] = sm90_ptx_sha256(
        pv._prepare_node_inputs_kernel,
        {
            **{name: "*bf16" for name in ("q", "k", "a", "b")},
            **{name: "*fp32" for name in ("A_log", "dt_bias", "q_out", "k_out", "decay_out", "beta_out")},
            **dict.fromkeys(("softplus_beta", "softplus_threshold", "scale"), "fp32"),
        },
        dict(H=16, HV=32, K=128, BK=128, USE_QK_L2NORM=True),
        num_warps=1,
        num_stages=3,
    )
    wy_types = path_kernel_types("fp32")
    wy_types.update(ancestors="*fp32")
    digests["wy_verify"] = sm90_ptx_sha256(
        wy._wy_verify_kernel,
        wy_types,
        dict(**heads, BT=32, BV=32, USE_QK_L2NORM=True, DOT_FP32=False),
        num_warps=8,
        num_stages=3,
    )
    return digests


def _cases(device: str) -> list[dict]:
    """(batch, nodes, heads, pool dtype) per case: the entry's heads on a GPU, small ones under the interpreter."""
    if device == "cpu":
        return [
            dict(B=2, T=5, heads=(2, 4, 16, 8), pool=torch.float32),
            dict(B=3, T=12, heads=(1, 2, 32, 16), pool=torch.bfloat16),
            dict(B=1, T=16, heads=(2, 2, 16, 16), pool=torch.float32),
        ]
    # one node count (T is a compile-time constant) and one pool dtype keep the compiles within the stage's time;
    # the bf16-pool commit is compared by its PTX
    return [dict(B=B, T=32, heads=(16, 32, 128, 128), pool=torch.float32) for B in (1, 8, 32)]


def _calls(mod, case: dict, gen: torch.Generator, device: str, fresh_pool: bool = True):
    """Each checked call of ``mod`` (a gdn_tree package) on the case's inputs: name -> zero-argument call whose result
    is compared. Inputs depend only on ``gen``'s seed, so both packages see the same ones. ``fresh_pool``: each
    commit starts from the inputs' pool (else it advances one scratch pool call after call, for timing)."""
    B, T = case["B"], case["T"]
    q, k, v, a, b, A_log, dt_bias, (pool,), idx = make_inputs(
        B, T, gen, case["pool"], heads=case["heads"], device=device
    )
    trees = [random_tree(T, gen, chain_bias=bias) for bias in (0.6, 0.2, 1.0)]
    parents = torch.tensor([trees[i % len(trees)] for i in range(B)], dtype=torch.int32, device=device)
    num_nodes = torch.tensor([T - (i % 3) for i in range(B)], dtype=torch.int32, device=device)
    paths = deepest_root_paths(parents.cpu())  # accepted: each request's deepest root path, some cut shorter
    accepted = torch.tensor([p + [0] * (T - len(p)) for p in paths], dtype=torch.int32, device=device)
    accept_len = torch.tensor([max(0, len(p) - i % 3) for i, p in enumerate(paths)], dtype=torch.int32, device=device)
    base = (q, k, v, a, b, A_log, dt_bias)
    triton_only = dict(lanes_per_column=None)
    schedules = {saved: mod.tree_schedule(parents, num_nodes, max_saved=saved) for saved in (0, 8)}
    ancestors = mod.tree_ancestors(parents, num_nodes)
    scratch = pool.clone()

    def verify(max_saved, **options):
        return lambda: mod.gdn_tree_path_verify(*base, pool, idx, schedules[max_saved], **triton_only, **options)

    def commit(**options):
        def run():
            if fresh_pool:
                scratch.copy_(pool)
            mod.gdn_tree_commit(*base, scratch, idx, accepted, accept_len, **triton_only, **options)
            return scratch  # compared before the next call writes it

        return run

    def schedule_tensors():
        s = mod.tree_schedule(parents, num_nodes, max_saved=8)
        return torch.stack([s.order, s.replay_len, s.restore_slot, s.save_slot]), s.replay

    return {
        "schedule": schedule_tensors,
        "verify_kept8_prefetch": verify(8),
        "verify_kept8": verify(8, prefetch=False),
        "verify_replay": verify(0, prefetch=False),
        "verify_kept8_prepared": verify(8, prepare_inputs=True),
        "commit_prefetch": commit(),
        "commit": commit(prefetch=False),
        "wy_verify": lambda: mod.gdn_tree_wy_verify(*base, pool, idx, ancestors, num_nodes),
    }


def _same_bits(x, y) -> bool:
    if isinstance(x, tuple):
        return all(_same_bits(a, b) for a, b in zip(x, y, strict=True))
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def bits(library, copy, device: str) -> dict:
    rows = {}
    for n, case in enumerate(_cases(device)):
        calls = [_calls(mod, case, torch.Generator().manual_seed(n), device) for mod in (library, copy)]
        same = {name: _same_bits(calls[0][name](), calls[1][name]()) for name in calls[0]}
        label = f"B{case['B']}_T{case['T']}_heads{'x'.join(map(str, case['heads']))}_{str(case['pool'])[6:]}"
        rows[label] = same
    rows["all_identical"] = all(all(row.values()) for row in rows.values())
    return rows


def timing(library, copy, replays: int) -> dict:
    rows = {}
    for n, case in enumerate(_cases("cuda")):
        calls = [
            _calls(mod, case, torch.Generator().manual_seed(n), "cuda", fresh_pool=False) for mod in (library, copy)
        ]
        row = {}
        for name in calls[0]:
            if name == "schedule":
                continue
            lib_us, copy_us = (graph_replay_us(lambda _, fn=c[name]: fn(), replays=replays) for c in calls)
            row[name] = {"library_us": lib_us, "vendored_us": copy_us, "ratio": lib_us / copy_us}
        rows[f"B{case['B']}_T{case['T']}"] = row
    ratios = [r["ratio"] for row in rows.values() for r in row.values()]
    rows["ratio_range"] = [min(ratios), max(ratios)]
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="bits,timing", help="comma-separated: ptx, bits, timing")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        copy, differs = vendored_copy(Path(tmp))
        library = importlib.import_module("specpilot_kernels.gdn_tree")
        doc = {
            **result_header("gdn_tree_vendored_check", argv),
            "synthetic": True,
            "label": "random inputs and trees; library kernels vs the gdn-tree entry's vendored copy",
            "vendored": str(PATCH.relative_to(ROOT)),
            "files_that_differ": differs,
        }
        if "ptx" in sections:

            def ptx():
                lib, vend = ptx_digests("specpilot_kernels"), ptx_digests(COPY_PACKAGE)
                return {"identical": {k: lib[k] == vend[k] for k in lib}, "library": lib, "vendored": vend}

            record_section(doc, "ptx", ptx, args.out)
        if "bits" in sections:
            record_section(doc, "bits", lambda: bits(library, copy, args.device), args.out)
        if "timing" in sections and args.device == "cuda":
            record_section(doc, "timing", lambda: timing(library, copy, args.replays), args.out)
        doc["summary"] = {
            "ptx_identical": all(doc["ptx"]["identical"].values()) if "identical" in doc.get("ptx", {}) else None,
            "bits_identical": doc.get("bits", {}).get("all_identical"),
            "time_ratio_range": doc.get("timing", {}).get("ratio_range"),
        }
        print_result(doc, args.out)


if __name__ == "__main__":
    main()
