"""The index of benchmark results: which file holds each benchmark's current figures, the commit it measured, where.

    python scripts/results_index.py            # rewrite benchmarks/results/INDEX.md, index.json, archive/INDEX.md
    python scripts/results_index.py --check    # fail if those are stale, a harness is not code, a link is broken,
                                               # or the README is over its limits
    python scripts/results_index.py --extract-probes   # write the harness code embedded in result JSON to probes/

``benchmarks/results/`` holds the current file of each benchmark (and setting: device, shape set, model);
``benchmarks/archive/results/`` every older run, names unchanged, so nothing measured is lost. A result written
through :func:`specpilot_mem.provenance.write_result` records its commit and dirty flag; for older files the
commit is derived from git history: the commit that wrote the file's content if that commit also changed code (the
results were committed with the code they measured), else its parent. Derived commits are marked as such.

Probe harnesses that exist inside result JSON (A/B scripts, kernel variants as diffs) are kept as code under
``benchmarks/probes/<result>/``, byte for byte the string the JSON holds; ``--check`` fails on one without its file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specpilot_mem.errors import SpecPilotError  # noqa: E402
from specpilot_mem.git import Repo  # noqa: E402

RESULTS = Path("benchmarks/results")
ARCHIVE = Path("benchmarks/archive/results")
PROBES = Path("benchmarks/probes")
INDEX_MD = RESULTS / "INDEX.md"
INDEX_JSON = RESULTS / "index.json"
ARCHIVE_MD = ARCHIVE.parent / "INDEX.md"
README = Path("README.md")
GENERATED = {INDEX_MD.name, INDEX_JSON.name}

# Legacy files name their benchmark informally; the file name's prefix says which script wrote it.
PREFIXES = (
    ("certified_head", "certified_head_bench"),
    ("controller-paired", "controller_paired_bench"),
    ("engine-pair", "engine_pair_eval"),
    ("engine-step-bench", "engine_step_bench"),
    ("fault_study", "fault_study"),
    ("gdn_tree", "gdn_tree_bench"),
    ("gpu-tests", "pytest -m gpu"),
    ("registry", "registry_bench"),
    ("replay_bench", "replay_bench"),
    ("replay_fig10", "specpilot-mem replay --figure"),
    ("sglang-export", "sglang_export_bench"),
    ("store_bench", "store_bench"),
    ("w12-gemm-speedup", "scripts/w12_plot.py"),
    ("w12-gemm", "w12_gemm_bench"),
    ("w12-hf-decode", "w12_hf_decode"),
    ("w12-qpass", "w12_qpass_agreement"),
    ("w12-sass", "w12_sass"),
)
# A commit touching code here committed results with the code they measured (see History.derived).
CODE_DIRS = ("specpilot_mem/", "benchmarks/", "scripts/")
PROBE_KEY = re.compile(r"harness|script|source|generator|diff", re.I)
RESULT_LINK = re.compile(r"benchmarks/(archive/)?results/([A-Za-z0-9_.\-]+\.(?:json\.gz|json|png))")  # (archive/, name)


class ResultsIndexError(SpecPilotError):
    """A result file the index cannot read."""


# -- reading result files ------------------------------------------------------------------------------------------


def load(path: Path) -> dict | None:
    """The JSON document of a result file (None for a picture)."""
    if path.suffix != ".json":
        return None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsIndexError(
            f"not valid JSON ({exc})", where=str(path), fix="write results with specpilot_mem.provenance.write_result"
        ) from exc
    return doc if isinstance(doc, dict) else {"content": doc}


def load_sibling(picture: Path) -> dict | None:
    """The result a figure was drawn from, where it sits beside it (``X-figure4.png`` beside ``X.json``)."""
    sibling = picture.with_name(re.sub(r"-figure\d+$", "", picture.stem) + ".json")
    return load(sibling) if sibling.exists() else None


def benchmark_of(name: str, doc: dict | None) -> str:
    """The script that wrote a result: the header's name when it is a script here, else the file name's prefix."""
    declared = (doc or {}).get("benchmark")
    if isinstance(declared, str) and (ROOT / "benchmarks" / f"{declared}.py").exists():
        return declared
    for prefix, script in PREFIXES:
        if name.startswith(prefix):
            return script
    return str(declared) if declared else "unknown"


def date_of(name: str, doc: dict | None) -> str:
    for source in ((doc or {}).get("date"), ((doc or {}).get("printed") or {}).get("date"), name):
        if isinstance(source, str) and (match := re.search(r"\d{4}-\d{2}-\d{2}", source)):
            return match.group(0)
    return "unknown"


def device_of(name: str, doc: dict | None) -> str:
    """A short device description from the many forms legacy headers used (and the shared header's)."""
    doc = doc or {}
    device = doc.get("device", (doc.get("printed") or {}).get("device"))
    if isinstance(device, dict):
        if device.get("kind") == "cuda":
            count = device.get("count", 1)
            return f"{device.get('name')}{f' x{count}' if count and count > 1 else ''}"
        cores = device.get("cores")
        cpu = device.get("name") or device.get("cpu") or "CPU"
        return f"CPU {cpu}{f', {cores} cores' if cores else ''}"
    if isinstance(device, list):
        return f"{device[0]} x{len(device)}" if len(set(device)) == 1 else ", ".join(map(str, device))
    if isinstance(device, str):
        return re.sub(r",\s*(float32|bfloat16|float16)$", "", device)
    if "sm90a" in name or doc.get("arch"):
        return f"nvcc, {doc.get('arch', 'sm_90a')} (no GPU)"
    if "h200" in name:
        return "NVIDIA H200"
    return "unknown"


# -- headline figures: one extractor per benchmark, for the current files ------------------------------------------


def _r(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def _span(values: list[float], digits: int = 2, unit: str = "") -> str:
    low, high = min(values), max(values)
    return (
        f"{_r(low, digits)}{unit}"
        if _r(low, digits) == _r(high, digits)
        else f"{_r(low, digits)}–{_r(high, digits)}{unit}"
    )


def _store(doc: dict) -> str:
    f = doc["figures"]
    return (
        f"init {f['init_s']} s; apply a {f['apply_chain_entries']}-entry chain {f['apply_chain_in_process_s']} s "
        f"in process, {f['apply_chain_cli_s']} s as a command; verify {f['verify_entries']} entries "
        f"{f['verify_s']} s"
    )


def _registry(doc: dict) -> str:
    f = doc["figures"]
    queries = [q["query_on_open_connection"]["median_ms"] for q in f["queries"].values()]
    command_ms = f["cli_query_gpu_sm_120"]["median_ms"]
    return (
        f"query {_span(queries, 0)} ms in process; `query` command {command_ms:.0f} ms; "
        f"incremental sync {f['incremental_sync_one_record']['median_ms']:.0f} ms"
    )


def _replay(doc: dict) -> str:
    return (
        f"best-first build {_r(doc['build']['us_per_step_wall_median'], 1)} µs a request-step; replay of "
        f"{doc['replay']['lattice_steps']:,} lattice steps {_r(doc['replay']['seconds_wall'])} s"
    )


def _figure10(doc: dict) -> str:
    taus = [run["tau"] for run in doc["replay"]["runs"]]
    return f"Figure 10 on synthetic lattices: τ {_span(taus)} over {len(taus)} builder × budget runs"


def _sglang_export(doc: dict) -> str:
    return (
        f"apply + export {doc['apply_and_export_cold']['wall_s']} s; import server_args "
        f"{doc['import_server_args_warm_bytecode']['cpu_s']} s CPU (warm bytecode)"
    )


def _engine_pair(doc: dict) -> str:
    unseen = doc["replay"]["stdlib/unseen"]
    return (
        f"replay τ on unseen: chain@8 {_r(unseen['chain@8'])}, best-first@32 {_r(unseen['best-first@32'])}, "
        f"oracle@16 {_r(unseen['oracle@16'])}"
    )


def _engine_step(doc: dict) -> str:
    # A run whose figures were kept under "printed" beside a note: its generate section is not meaningful.
    annotated = "printed" in doc
    doc = doc.get("printed", doc)
    verify = doc["steps"]["verify_ms"]
    rows = sorted(verify, key=int)
    text = f"verify step {_r(verify[rows[0]])} → {_r(verify[rows[-1]])} ms at {rows[0]} → {rows[-1]} rows"
    ar = doc.get("generate", {}).get("runs", {}).get("ar")
    return text + (f"; AR {ar['tokens_per_s_per_request']:.0f} tokens/s a request" if ar and not annotated else "")


def _controller(doc: dict) -> str:
    noise = [doc[mode]["noise"]["noise"] * 100 for mode in ("interleaved", "pool")]
    gain = doc["interleaved"]["decision"]
    return (
        f"stock-vs-stock noise {_r(noise[0])}% interleaved / {_r(noise[1])}% pool; gain {_r(gain['gain'])}x "
        f"[{_r(gain['low'])}, {_r(gain['high'])}]"
    )


def _fault_study(doc: dict) -> str:
    return (
        f"fault rejected in {doc['fault_rejected']} of {doc['fault_runs']} runs; lossless variants rejected in "
        f"{doc['lossless_rejected']} of {doc['lossless_runs']}"
    )


def _gdn_tree(doc: dict) -> str:
    if "wy_vs_path" in doc and "verify_plus_commit" not in doc:
        return f"WY verify {_span([r['wy_speedup'] for r in doc['wy_vs_path']])}x the path kernel's speed"
    rows = doc["verify_plus_commit"]
    speedups = [v["speedup"] for r in rows for v in r["variants"] if v.get("defaults")]
    return (
        f"path verify + commit {_span(speedups)}x SGLang's snapshot verify at B = "
        f"{rows[0]['B']}–{rows[-1]['B']}; no per-node state"
    )


def _certified_head(doc: dict) -> str:
    speedups = {int(m): v["b:bf16_head"]["us"] / v["c:warp_cuda_exact"]["us"] for m, v in doc["variants"].items()}
    check = doc.get("property_check", {})
    return (
        f"{_span(list(speedups.values()))}x the BF16 head at {min(speedups)}–{max(speedups)} rows; "
        f"{check.get('rows', 0):,} adversarial rows, {check.get('disagreements')} disagreements"
    )


def _w12_gemm(doc: dict) -> str:
    summary = doc.get("summary") or {}
    if "mma_geomean_speedup_projections_1_32" in summary:
        return (
            f"projections 1–32 rows {_r(summary['mma_geomean_speedup_projections_1_32'], 3)}x cuBLAS geomean "
            f"(slowest {_r(summary['mma_min_speedup_projections_1_32'])}x); LM head ≥ "
            f"{_r(summary['mma_lm_head_min_speedup_1_32'])}x at ≥ "
            f"{summary['mma_lm_head_frac_floor_1_32_min']:.1%} of its floor; gate_up ≥ "
            f"{summary['mma_gate_up_frac_floor_1_32_min']:.1%} of its floor"
        )
    speedups = [
        row["mma_speedup"]
        for shape in doc["shapes"].values()
        for row in shape.get("rows", [])
        if "mma_speedup" in row and row["M"] <= 32
    ]
    return f"{len(doc['shapes'])} shapes: {_span(speedups)}x cuBLAS at 1–32 rows"


def _w12_hf(doc: dict) -> str:
    parts = []
    for model, figures in doc["models"].items():
        by_batch = figures["batches"]
        speedups = [by_batch[b]["per_layer"]["w12"]["speedup"] for b in sorted(by_batch, key=int)]
        parts.append(
            f"{model}: {_r(speedups[0], 3)}x BF16 at {min(by_batch, key=int)} request, {_r(speedups[-1], 3)}x "
            f"at {max(by_batch, key=int)}"
        )
    return "; ".join(parts)


def _w12_qpass(doc: dict) -> str:
    by = {(r["low_bits"], r["lm_head_on_view"]): r["top1_agreement"] for r in doc["results"]}
    return (
        f"top-1 agreement {by['midpoint', False]:.1%} (dropped bits at midpoint), {by['truncated', False]:.1%} "
        f"(truncated)"
    )


def _w12_sass(doc: dict) -> str:
    registers = [k["registers"] for k in doc["kernels"] if k.get("registers")]
    return f"{len(doc['kernels'])} kernels, {min(registers)}–{max(registers)} registers"


def _gpu_tests(doc: dict) -> str:
    tail = doc["content" if "content" in doc else "runs"][0]["output_tail"]
    return next(line.strip() for line in reversed(tail.strip().splitlines()) if "passed" in line)


def _cli_startup(doc: dict) -> str:
    f = doc["figures"]
    return (
        f"`import specpilot_mem.main` {f['import_main_cpu_s']} s CPU ({f['import_main_s']} s wall); "
        f"`--help` {f['help_cpu_s']} s CPU ({f['help_s']} s wall); heavy imports: {f['heavy_imports'] or 'none'}"
    )


def _release_port(doc: dict) -> str:
    runs = doc["releases"]
    seconds = [run["seconds"] for run in runs.values()]
    verdicts = sorted({v for run in runs.values() for v in run["verdicts"].values()})
    return (
        f"{len(doc['entries'])} entries onto {', '.join(sorted(runs))}: {_span(seconds, 1)} s a release from the "
        f"cached wheel, import included; verdicts {', '.join(verdicts)}"
    )


def _controller_pool(doc: dict) -> str:
    # a section that failed records its error instead of its figures (record_section)
    noise = {mode: (doc.get(f"{mode}/noise") or {}).get("noise") for mode in ("interleaved", "pool")}
    if not all(noise.values()):
        return "a noise section did not finish: " + "; ".join(
            f"{mode}: {(doc.get(f'{mode}/noise') or {}).get('error', 'missing')}" for mode, n in noise.items() if not n
        )
    slots = len(doc["pool/noise"]["slots"])
    return (
        f"stock-vs-stock noise {noise['interleaved']['noise']:.1%} interleaved / {noise['pool']['noise']:.1%} "
        f"pool of {slots} worker processes ({doc['pool_over_interleaved_noise']}x)"
    )


HEADLINES: dict[str, Callable[[dict], str]] = {
    "release_port_bench": _release_port,
    "controller_pool_bench": _controller_pool,
    "store_bench": _store,
    "registry_bench": _registry,
    "replay_bench": _replay,
    "specpilot-mem replay --figure": _figure10,
    "sglang_export_bench": _sglang_export,
    "engine_pair_eval": _engine_pair,
    "engine_step_bench": _engine_step,
    "controller_paired_bench": _controller,
    "fault_study": _fault_study,
    "gdn_tree_bench": _gdn_tree,
    "certified_head_bench": _certified_head,
    "w12_gemm_bench": _w12_gemm,
    "w12_hf_decode": _w12_hf,
    "w12_qpass_agreement": _w12_qpass,
    "w12_sass": _w12_sass,
    "pytest -m gpu": _gpu_tests,
    "cli_startup_bench": _cli_startup,
}


def headline(benchmark: str, name: str, doc: dict | None) -> str:
    """The figure a reader wants first: the document's own ``headline`` if it has one, else its extractor's."""
    if doc is None:
        return "figure (PNG)"
    if isinstance(doc.get("headline"), str):
        return doc["headline"]
    extract = HEADLINES.get(benchmark)
    if extract is None:
        return "no headline (add a `headline` field or an extractor in scripts/results_index.py)"
    try:
        return extract(doc)
    except (KeyError, TypeError, ValueError, IndexError, StopIteration, ZeroDivisionError) as exc:
        raise ResultsIndexError(
            f"the {benchmark} headline cannot be read ({type(exc).__name__}: {exc})",
            where=str(RESULTS / name),
            fix="add a `headline` field to the result, or update its extractor here",
        ) from exc


# -- git provenance ------------------------------------------------------------------------------------------------


class History:
    """Which commit wrote each result file's content (following renames into the archive), from one ``git log``."""

    def __init__(self, repo: Repo):
        self.written: dict[str, str] = {}
        self.parent: dict[str, str | None] = {}
        self.code: dict[str, bool] = {}
        log = repo.out("log", "--reverse", "-M", "--name-status", "--format=%x00%H %P", "HEAD")
        for block in log.split("\0")[1:]:
            head, *lines = block.strip("\n").split("\n")
            commit, *parents = head.split()
            self.parent[commit] = parents[0] if parents else None
            paths = []
            for line in filter(None, lines):
                status, *names = line.split("\t")
                paths.append(names[-1])
                if status in ("A", "M"):
                    self.written[names[0]] = commit
                elif status.startswith("R"):  # R100 moves the bytes; a lower score also changed them
                    previous = self.written.pop(names[0], commit)
                    self.written[names[1]] = previous if status == "R100" else commit
            self.code[commit] = any(is_code(p) for p in paths)

    def derived(self, path: str) -> dict:
        written = self.written.get(path)
        if written is None:
            return {"commit": None, "dirty": None, "source": "not committed yet"}
        measured = written if self.code[written] or self.parent[written] is None else self.parent[written]
        return {
            "commit": measured,
            "dirty": None,
            "source": "derived",
            "committed_in": written,
            "rule": "the commit that wrote the file (it also changed code)"
            if measured == written
            else "the parent of the commit that wrote the file (which changed no code)",
        }


def is_code(path: str) -> bool:
    """Whether a path is code a benchmark measures: the kernel library (sources and tuned configs), Python."""
    if path.startswith(("benchmarks/results/", "benchmarks/archive/", "benchmarks/probes/")):
        return False
    return path.startswith("kernels/") or (path.startswith(CODE_DIRS) and path.endswith(".py"))


def provenance(doc: dict | None, path: str, history: History | None) -> dict:
    git = (doc or {}).get("git")
    if isinstance(git, dict) and git.get("commit"):
        return {"commit": git["commit"], "dirty": git.get("dirty"), "source": git.get("source", "recorded")}
    if history is None:
        return {"commit": None, "dirty": None, "source": "no git history"}
    return history.derived(path)


# -- probe harnesses -----------------------------------------------------------------------------------------------


def embedded_probes(doc: dict | None) -> Iterator[tuple[str, str]]:
    """(JSON path, code) of every harness, script or diff a result document holds as a multi-line string."""

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, [*path, str(key)])
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, [*path, str(i)])
        elif isinstance(node, str) and "\n" in node and any(PROBE_KEY.search(p) for p in path[-2:]):
            yield "/".join(path), node

    yield from walk(doc or {}, [])


def probe_suffix(key: str, code: str) -> str:
    leaf = key.rsplit("/", 1)[-1]
    if leaf.endswith((".py", ".sh")):
        return ""
    if code.startswith(("diff --git", "--- ")):
        return ".patch"
    if code.startswith(("#!/bin/bash", "# ")) and "import " not in code.split("\n", 3)[-1][:200]:
        return ".sh"
    if code.startswith("//"):
        return ".cu"
    return ".py"


def probe_name(key: str, code: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", key.replace(".gpu/", "")).strip("-.")
    return slug + probe_suffix(key, code)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def probe_files(root: Path) -> dict[str, str]:
    """{sha256 of the content: path} of every file under benchmarks/probes/ (the first, in sorted order)."""
    out: dict[str, str] = {}
    for path in sorted((root / PROBES).rglob("*")):
        if path.is_file() and path.name != "README.md":
            out.setdefault(digest(path.read_text()), path.relative_to(root).as_posix())
    return out


# -- the index -----------------------------------------------------------------------------------------------------


def readme_rows(root: Path) -> dict[str, list[str]]:
    """{result file name: first cells of the README rows that link it}."""
    rows: dict[str, list[str]] = {}
    for line in (root / README).read_text().splitlines():
        if line.startswith("|"):
            for _, name in RESULT_LINK.findall(line):
                rows.setdefault(name, []).append(line.strip("|").split("|")[0].strip())
    return rows


def build(root: Path) -> dict:
    repo = Repo(root)
    history = History(repo) if repo.rev_parse("HEAD") else None
    probes = probe_files(root)
    readme = readme_rows(root)
    index: dict[str, list] = {"current": [], "archived": [], "problems": []}
    for kind, folder in (("current", RESULTS), ("archived", ARCHIVE)):
        for path in sorted((root / folder).iterdir()):
            if path.name in GENERATED or path.name.startswith(".") or path.suffix not in (".json", ".png"):
                continue
            rel = (folder / path.name).as_posix()
            doc = load(path)
            described = doc if doc is not None else load_sibling(path)  # a figure: the run it was drawn from
            benchmark = benchmark_of(path.name, described)
            row = {
                "file": rel,
                "benchmark": benchmark,
                "git": provenance(doc, rel, history),
                "device": device_of(path.name, described) if described is not None else "—",
                "date": date_of(path.name, described),
                "probes": [],
            }
            for key, code in embedded_probes(doc):
                found = probes.get(digest(code))
                row["probes"].append({"key": key, "file": found})
                if found is None:
                    index["problems"].append(
                        f"{rel}: the harness at '{key}' is not code under {PROBES}/ "
                        "(run scripts/results_index.py --extract-probes)"
                    )
            if kind == "current":
                row["headline"] = headline(benchmark, path.name, doc)
                row["readme_rows"] = readme.get(path.name, [])
            index[kind].append(row)
    known = {Path(r["file"]).name for r in index["current"]}
    for name in readme:
        if name not in known:
            index["problems"].append(f"README.md links benchmarks/results/{name}, which is not a current result")
    return index


README_MAX_LINES = 150
README_MAX_CELL = 200


def readme_problems(root: Path, index: dict) -> list[str]:
    """The README's limits: at most 150 lines, no table cell over 200 characters, and every row of its Performance
    table links a current result file whose commit is known (recorded by the run, or derived from git history)."""
    lines = (root / README).read_text().splitlines()
    problems = []
    if len(lines) > README_MAX_LINES:
        problems.append(f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/")
    commits = {Path(r["file"]).name: r["git"].get("commit") for r in index["current"]}
    section = None
    for number, line in enumerate(lines, 1):
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for cell_text in cells:
            if len(cell_text) > README_MAX_CELL:
                problems.append(
                    f"README.md:{number}: a table cell of {len(cell_text)} characters (at most "
                    f"{README_MAX_CELL}): give the current figure once and link its result"
                )
        if section != "Performance" or set(line) <= set("|- ") or cells[0] == "what":
            continue
        linked = [name for _, name in RESULT_LINK.findall(line)]
        if not linked:
            problems.append(f"README.md:{number}: a performance row without a link to its result file")
        for name in linked:
            if f"benchmarks/results/{name}" not in line:
                problems.append(f"README.md:{number}: {name} is not linked under benchmarks/results/ (current)")
            elif name not in commits:
                problems.append(f"README.md:{number}: benchmarks/results/{name} does not exist")
            elif not commits[name]:
                problems.append(
                    f"README.md:{number}: benchmarks/results/{name} records no commit and none can be "
                    "derived (commit it, or rerun through specpilot_mem.provenance)"
                )
    return problems


def short(commit: str | None) -> str:
    return f"`{commit[:10]}`" if commit else "—"


def commit_cell(git: dict) -> str:
    if git.get("source") == "derived":
        return f"{short(git['commit'])} (derived; file from {short(git['committed_in'])})"
    return short(git.get("commit")) + (" (dirty)" if git.get("dirty") else "")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_current(index: dict) -> str:
    lines = [
        "# Benchmark results: the current file of each benchmark",
        "",
        "Generated by `python scripts/results_index.py` from the files beside it (do not edit by hand; `--check` in",
        "CI fails when it is stale). Older runs are in [`../archive/results/`](../archive/INDEX.md). A commit marked",
        "*derived* was not recorded by the run: it is the commit that wrote the file's content when that commit also",
        "changed code (kernels, tuned configs, Python), else that commit's parent. Results written through",
        "`specpilot_mem.provenance.write_result` record their commit and dirty flag.",
        "",
        "| benchmark | file | git commit | device | date | headline figure | README row |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in index["current"]:
        name = Path(row["file"]).name
        lines.append(
            f"| {row['benchmark']} | [{name}]({name}) | {commit_cell(row['git'])} | {cell(row['device'])} | "
            f"{row['date']} | {cell(row['headline'])} | {cell('; '.join(row['readme_rows'])) or '—'} |"
        )
    return "\n".join(lines) + "\n"


def render_archive(index: dict) -> str:
    lines = [
        "# Archived benchmark results",
        "",
        "Every run that is no longer a benchmark's current figure, under its original name (docs, commit messages",
        "and the archived lab notes in [`notes/`](notes/) cite these names). Generated by",
        "`python scripts/results_index.py`.",
        "Probe harnesses a result held as strings are code under [`../probes/`](../probes/).",
        "",
        "| benchmark | file | git commit | device | date | probe code |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in index["archived"]:
        name = Path(row["file"]).name
        probes = sorted({p["file"] for p in row["probes"] if p["file"]})
        links = ", ".join(f"[{Path(p).name}](../../{p})" for p in probes) or "—"
        lines.append(
            f"| {row['benchmark']} | [{name}](results/{name}) | {commit_cell(row['git'])} | "
            f"{cell(row['device'])} | {row['date']} | {links} |"
        )
    return "\n".join(lines) + "\n"


def outputs(index: dict) -> dict[Path, str]:
    public = {k: v for k, v in index.items() if k != "problems"}
    return {
        INDEX_MD: render_current(index),
        ARCHIVE_MD: render_archive(index),
        INDEX_JSON: json.dumps(public, indent=1, ensure_ascii=False) + "\n",
    }


# a line of a shell command that runs a Python script (a usage example), whose result paths are its arguments
COMMAND_LINE = re.compile(r"\bpython3?\s+(-m\s+\S+|\S+\.py)\b|^\s*--")


def stale_links(root: Path) -> tuple[list[str], list[str]]:
    """(links to results that moved to the archive, links to results that exist nowhere) in the repository's text."""
    current = {p.name for p in (root / RESULTS).iterdir()}
    archived = {p.name for p in (root / ARCHIVE).iterdir()}
    moved, missing = [], []
    tracked = Repo(root).out("ls-files").splitlines()
    for rel in tracked:
        # the results themselves, the fork, and tests (which build projects of their own) name no repository result
        if rel.startswith(("benchmarks/results/", "benchmarks/archive/", "sglang-fork", "tests/")) or not rel.endswith(
            (".md", ".py", ".yaml", ".patch", ".cu", ".cuh", ".sh", ".toml")
        ):
            continue
        text = (root / rel).read_text(errors="replace")
        lines = text.splitlines()
        for match in RESULT_LINK.finditer(text):
            in_archive, name = match.group(1), match.group(2)
            if ".." in name or name.startswith("."):  # a pattern in prose (v4a..v4d, ...json), not a file name
                continue
            line = text.count("\n", 0, match.start()) + 1
            if COMMAND_LINE.search(lines[line - 1]):  # a usage example: the file a run would read or write
                continue
            if name in current and name in archived:  # a newer run under the same name: each link names one
                continue
            if (name in archived and not in_archive) or (name in current and in_archive):
                moved.append(
                    f"{rel}:{line}: {match.group(0)} is now "
                    f"{'benchmarks/archive/results/' if name in archived else 'benchmarks/results/'}{name}"
                )
            elif name not in current and name not in archived:
                missing.append(f"{rel}:{line}: {match.group(0)} exists nowhere")
    return moved, missing


def extract_probes(root: Path) -> list[Path]:
    """Write every embedded harness that has no file yet to benchmarks/probes/<result>/<key>."""
    have = probe_files(root)
    written = []
    for folder in (RESULTS, ARCHIVE):
        for path in sorted((root / folder).glob("*.json")):
            for key, code in embedded_probes(load(path)):
                if digest(code) in have:
                    continue
                target = root / PROBES / path.stem / probe_name(key, code)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(code)
                have[digest(code)] = target.relative_to(root).as_posix()
                written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is stale or missing")
    parser.add_argument("--extract-probes", action="store_true", help="write embedded harnesses to benchmarks/probes/")
    parser.add_argument(
        "--links",
        action="store_true",
        help="also list every link that names a result by its path before it moved to the archive",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = args.root
    try:
        if args.extract_probes:
            for path in extract_probes(root):
                print(f"wrote {path.relative_to(root)}")
        index = build(root)
    except ResultsIndexError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    moved, missing = stale_links(root)
    problems = index["problems"] + missing + readme_problems(root, index)
    if args.check:
        for path, text in outputs(index).items():
            if not (root / path).exists() or (root / path).read_text() != text:
                problems.append(f"{path} is stale: run python scripts/results_index.py")
    else:
        for path, text in outputs(index).items():
            (root / path).write_text(text)
            print(f"wrote {path}")
    if args.links:
        for line in moved:
            print(f"note: {line}", file=sys.stderr)
    elif moved:
        print(
            f"note: {len(moved)} links name a result by its path before it moved (--links lists them)", file=sys.stderr
        )
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
