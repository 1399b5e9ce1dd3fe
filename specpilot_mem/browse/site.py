"""The memory browser: a static site of the memory, built from the records and the registry.

``build_site(home, out)`` writes

- ``index.html``: every entry with its status, scope and per-release verdicts, and a query form over the
  registry (its rows exported to ``data/index.js``; ``static/query.js`` filters them with the semantics of
  ``specpilot-mem query``: hardware match by GPU, arch or variant, model/drafter/regime fit, words, status);
- ``entries/<id>.html``: the record — options, variants, contract, limits, untested regimes, its requirement
  chain as a graph, per-release status, and its evidence with plots (``browse.evidence``);
- ``graph.html``: the requirement DAG; ``releases.html`` (and ``releases-2.html``, ... a hundred entries a
  page): the status of every entry on every release.

The site is plain files (no server needed, every link relative); ``serve`` serves it on localhost.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path

from specpilot_mem.browse.evidence import evidence_plots
from specpilot_mem.errors import SpecPilotError
from specpilot_mem.gpus import ARCHES, GPUS
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord
from specpilot_mem.store.records import replace_folder
from specpilot_mem.store.releases import version_key

STATIC = Path(__file__).with_name("static")
MARKER = ".specpilot-site"  # marks a folder as a built site, which a rebuild may replace
STATUS_CLASS = {"verified": "ok", "candidate": "warn", "superseded": "info", "unchecked": "muted"}
VERDICT_CLASS = {"clean": "ok", "drift": "warn", "conflict": "bad", "superseded": "info", "blocked": "bad"}


@dataclass
class BuildReport:
    out: Path
    entries: int
    pages: list[str]  # every page, relative to ``out``
    plots: int
    seconds: float


def _page(title: str, body: str, depth: int = 0, scripts: tuple[str, ...] = ()) -> str:
    up = "../" * depth
    tags = "".join(f'<script src="{up}{s}"></script>' for s in scripts)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · SpecPilot memory</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><link rel="stylesheet" href="{up}static/site.css"></head><body>'
        f'<header><a class="brand" href="{up}index.html">SpecPilot memory</a><nav>'
        f'<a href="{up}index.html">Entries &amp; query</a><a href="{up}graph.html">Requirement graph</a>'
        f'<a href="{up}releases.html">Releases</a></nav></header><main>{body}</main>{tags}</body></html>'
    )


def badge(text: str | None, css: str) -> str:
    return f'<span class="badge {css}">{escape(text or "-")}</span>'


def status_badge(status: str | None) -> str:
    status = status or "unchecked"
    return badge(status, STATUS_CLASS.get(status, "muted"))


def _list(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else '<p class="muted">none</p>'


def _table(head: list[str], rows: list[list[str]], css: str = "") -> str:
    if not rows:
        return '<p class="muted">none</p>'
    return (
        f'<table class="{css}"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
        + "</tbody></table>"
    )


def depths(order: list[str], records: dict[str, EntryRecord]) -> dict[str, int]:
    depth: dict[str, int] = {}
    for entry_id in order:
        depth[entry_id] = 1 + max((depth[r] for r in records[entry_id].requires), default=-1)
    return depth


def dag_svg(ids: list[str], records: dict[str, EntryRecord], href: str, focus: str | None = None) -> str:
    """A layered drawing of the requirement DAG of ``ids`` (requirement-closed, in order): columns by depth,
    an arrow from each entry to what it requires; every node links to its page (``href`` % id)."""
    depth = depths(ids, records)
    columns: dict[int, list[str]] = {}
    for entry_id in ids:
        columns.setdefault(depth[entry_id], []).append(entry_id)
    node_w, node_h, gap_x, gap_y = 150, 22, 60, 8
    pos = {}
    for level, members in columns.items():
        for n, entry_id in enumerate(members):
            pos[entry_id] = (10 + level * (node_w + gap_x), 10 + n * (node_h + gap_y))
    width = 20 + (max(columns, default=0) + 1) * (node_w + gap_x)
    height = 20 + max((len(m) for m in columns.values()), default=1) * (node_h + gap_y)
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="dag" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}"><defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" '
            'markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#8a94a3"/></marker></defs>'
        )
    ]
    # One path for every edge and one for the boxes of each status: thousands of separate elements (and arrow
    # markers) cost a large graph most of its load time. A node is then its label, linked to its page.
    edges = []
    for entry_id in ids:
        x0, y0 = pos[entry_id]
        for req in records[entry_id].requires:
            x1, y1 = pos[req]
            edges.append(f"M{x0},{y0 + node_h / 2:g}L{x1 + node_w},{y1 + node_h / 2:g}")
    if edges:
        arrow = ' marker-end="url(#arrow)"' if len(edges) == 1 else ""
        parts.append(f'<path d="{"".join(edges)}" class="edge" fill="none"{arrow}/>')
    boxes: dict[str, list[str]] = {}
    for entry_id in ids:
        x, y = pos[entry_id]
        css = "node focus" if entry_id == focus else f"node {STATUS_CLASS[records[entry_id].status]}"
        boxes.setdefault(css, []).append(f"M{x},{y}h{node_w}v{node_h}h-{node_w}z")
    parts += [f'<path class="{css}" d="{"".join(d)}"/>' for css, d in boxes.items()]
    for entry_id in ids:
        x, y = pos[entry_id]
        label = entry_id if len(entry_id) <= 22 else entry_id[:21] + "…"
        tip = f"<title>{escape(entry_id)}</title>" if label != entry_id else ""
        css = "node-label focus" if entry_id == focus else "node-label"
        parts.append(
            f'<a href="{escape(href % entry_id)}"><text x="{x + 6}" y="{y + 15}" class="{css}">'
            f"{escape(label)}</text>{tip}</a>"
        )
    return "".join(parts + ["</svg>"])


def _order(records: dict[str, EntryRecord], ids) -> list[str]:
    from specpilot_mem.store.requirements import closure, order

    return order(records, closure(records, ids))


def _neighbourhood(entry_id: str, records: dict[str, EntryRecord], required_by: list[str]) -> tuple[list[str], dict]:
    """The entry, what it requires and what requires it, as a small requirement-closed graph to draw."""
    members = [*records[entry_id].requires, entry_id, *required_by]
    shown = set(members)
    local = {
        i: records[i].model_copy(update={"requires": [r for r in records[i].requires if r in shown]}) for i in members
    }
    for req in records[entry_id].requires:
        local[req] = records[req].model_copy(update={"requires": []})
    for dependent in required_by:
        local[dependent] = records[dependent].model_copy(update={"requires": [entry_id]})
    return [*records[entry_id].requires, entry_id, *required_by], local


def _releases(records: dict[str, EntryRecord]) -> list[str]:
    seen = {r.release for rec in records.values() for r in rec.releases}
    seen |= {rec.scope.sglang for rec in records.values() if rec.scope.sglang}
    return sorted(seen, key=version_key)


def entry_page(
    home: Home, record: EntryRecord, records: dict[str, EntryRecord], required_by: list[str]
) -> tuple[str, int]:
    """The HTML of one entry's page and its number of plots."""
    r = record

    def link(i):
        return f'<a href="{escape(i)}.html">{escape(i)}</a>'

    parts = [
        f'<h1>{escape(r.id)} {status_badge(r.status)}</h1><p class="title">{escape(r.title)}</p>',
        f"<p>{escape(r.summary)}</p>",
    ]
    scope = r.scope
    parts.append(
        "<h2>Scope and status</h2>"
        + _table(
            ["SGLang", "arch", "target", "drafter", "regime", "status"],
            [
                [
                    escape(scope.sglang or "-"),
                    escape(", ".join(scope.arch) or "any"),
                    escape(", ".join(scope.target) or "any"),
                    escape(", ".join(scope.drafter) or "any"),
                    escape(", ".join(scope.regime) or "any"),
                    status_badge(r.status),
                ]
            ],
        )
    )
    rows = [
        [
            f'<span id="release-{escape(c.release)}">{escape(c.release)}</span>',
            status_badge(c.status),
            badge(c.verdict, VERDICT_CLASS[c.verdict]),
            escape(str(c.checked)),
            escape(", ".join(c.conflicts) or ", ".join(c.changed) or "-")
            + (f"<br>blocked by {', '.join(link(b) for b in c.blocked_by)}" if c.blocked_by else ""),
            escape(f"{c.port.delta} (from {c.port.source}, tree {c.port.reproduces[:12]})") if c.port else "-",
        ]
        for c in r.releases
    ]
    parts.append(
        "<h2>Per-release status</h2>" + _table(["release", "status", "verdict", "checked", "files", "port"], rows)
    )
    chain = _order(records, [r.id])
    shown, local = _neighbourhood(r.id, records, required_by)
    parts.append(
        "<h2>Requirements</h2><p>requires: "
        + (", ".join(link(i) for i in r.requires) or "nothing (stock)")
        + "</p><p>required by: "
        + (", ".join(link(i) for i in required_by) or "no entry")
        + "</p>"
        + f"<p>applied as the chain of {len(chain)}: "
        + " → ".join(link(i) for i in chain)
        + "</p>"
        + (f'<div class="scroll">{dag_svg(shown, local, "%s.html", focus=r.id)}</div>' if len(shown) > 1 else "")
    )
    parts.append(
        "<h2>Options</h2>"
        + _table(
            ["flag", "type", "default", "help"],
            [
                [
                    f"<code>{escape(o.name)}</code>",
                    escape(o.type),
                    f"<code>{escape(json.dumps(o.default))}</code>",
                    escape(o.help),
                ]
                for o in r.options
            ],
        )
    )
    parts.append(
        "<h2>Variants</h2>"
        + _table(
            ["name", "hardware", "options", "notes"],
            [
                [
                    escape(v.name),
                    escape(", ".join(v.hardware)),
                    f"<code>{escape(json.dumps(v.options))}</code>",
                    escape(v.notes),
                ]
                for v in r.variants
            ],
        )
    )
    parts.append(
        f"<h2>Contract</h2><p>{badge(r.contract.level, 'info')} {escape(r.contract.statement)}</p>"
        + _list([f"<code>{escape(c)}</code>" for c in r.contract.commands])
    )
    parts.append("<h2>Limits</h2>" + _list([escape(x) for x in r.limits]))
    parts.append(
        "<h2>Untested</h2>"
        + _list(
            [
                escape(u.note)
                + "".join(f" {badge(f'{k}: {v}', 'muted')}" for k, v in u.model_dump().items() if k != "note" and v)
                for u in r.untested
            ]
        )
    )
    parts.append("<h2>Evidence</h2>")
    plots = 0
    if not r.evidence:
        parts.append('<p class="muted">no evidence recorded</p>')
    for n, ev in enumerate(r.evidence):
        dep = ev.deployment
        setting = ", ".join(
            x
            for x in (
                f"{dep.gpu} ({dep.arch})",
                dep.target,
                dep.drafter,
                dep.regime,
                f"batch {', '.join(map(str, dep.batch_sizes))}" if dep.batch_sizes else None,
            )
            if x
        )
        figures = _table(
            ["figure", "value", "95% interval"],
            [
                [
                    escape(f.name),
                    escape(f"{f.value:g} {f.unit}"),
                    escape(f"[{f.ci_low:g}, {f.ci_high:g}]") if f.ci_low is not None and f.ci_high is not None else "-",
                ]
                for f in ev.figures
            ],
            "figures",
        )
        found, problem = evidence_plots(ev, home.root)
        plots += len(found)
        svgs = "".join(
            f"<figure>{p.svg()}<figcaption>{escape(p.kind)} · from {escape(p.source)}</figcaption></figure>"
            for p in found
        )
        parts.append(
            f'<section class="evidence" id="evidence-{n}"><h3>{escape(ev.kind)} · {escape(str(ev.date))}'
            f"{' ' + badge('synthetic', 'muted') if ev.synthetic else ''}</h3><p>{escape(setting)}</p>"
            + (f"<p><b>verdict:</b> {escape(ev.verdict)}</p>" if ev.verdict else "")
            + f"<p><b>command:</b> <code>{escape(ev.command)}</code></p>"
            + (f"<p><b>results:</b> <code>{escape(ev.results)}</code></p>" if ev.results else "")
            + (f'<p class="bad-text">{escape(problem)}</p>' if problem else "")
            + f'<div class="plots">{svgs}</div>'
            + figures
            + "</section>"
        )
    parts.append(
        "<h2>Source</h2>"
        + _table(
            ["field", "value"],
            [
                ["reproduces", f"<code>{r.reproduces}</code>"],
                ["recorded", escape(str(r.recorded or "-"))],
                ["source", escape(", ".join(f"{k}: {v}" for k, v in r.source.model_dump().items() if v) or "-")],
                ["vendored kernels", escape(str(len(r.kernels)))],
            ],
        )
    )
    return _page(r.id, "".join(parts), depth=1), plots


def index_data(home: Home) -> tuple[dict, dict[str, EntryRecord]]:
    """The registry's rows as the query form needs them (one card per entry) with the GPU table, and every record
    (from the registry, which holds each one whole: parsing a thousand YAML files would cost the build seconds)."""
    from specpilot_mem.registry.sync import connect

    con = connect(home)
    try:
        rows = con.execute(
            "SELECT id, title, validated, status, scope_sglang, search_text, card, record FROM entries ORDER BY id"
        ).fetchall()
    finally:
        con.close()
    entries, records = [], {}
    for entry_id, title, validated, status, sglang, search_text, card, record in rows:
        records[entry_id] = EntryRecord.model_validate_json(record)
        card = json.loads(card)
        entries.append(
            {
                "id": entry_id,
                "title": title,
                "validated": validated,
                "status": status,
                "sglang": sglang,
                "text": search_text,
                "requires": card["requires"],
                "variants": card["variants"],
                "evidence": card["evidence"],
                "untested": card["untested"],
                "releases": card["releases"],
            }
        )
    return {
        "entries": entries,
        "arches": list(ARCHES),
        "gpus": [{"name": g.name, "aliases": list(g.aliases), "arch": g.arch} for g in GPUS],
    }, records


def compact_index(data: dict) -> dict:
    """``data`` as ``data/index.js`` holds it: each entry, evidence item, figure, variant and release check a list
    in a fixed field order, and every repeated name (status, kind, GPU, arch, model, drafter, regime, date,
    release) an index into one ``strings`` table. Cards as objects spell each key and name again in every row,
    and parsing that was most of the index page's load on a large memory. ``static/query.js``'s
    ``expand`` reads this layout back into the cards, field by field in the same order."""
    strings: list[str] = []
    index: dict[str, int] = {}

    def name(value: str | None) -> int:
        if value is None:
            return -1
        if value not in index:
            index[value] = len(strings)
            strings.append(value)
        return index[value]

    def figure(f: dict | None) -> list | int:
        return 0 if f is None else [name(f["name"]), f["value"], name(f["unit"]), f["ci_low"], f["ci_high"]]

    entries = [
        [
            e["id"],
            e["title"],
            int(e["validated"]),
            name(e["status"]),
            name(e["sglang"]),
            e["text"],
            e["requires"],
            [[v["name"], [name(h) for h in v["hardware"]]] for v in e["variants"]],
            [
                [
                    ev["idx"],
                    name(ev["kind"]),
                    name(ev["gpu"]),
                    name(ev["gpu_name"]),
                    name(ev["arch"]),
                    name(ev["target"]),
                    name(ev["drafter"]),
                    name(ev["regime"]),
                    int(ev["synthetic"]),
                    name(ev["date"]),
                    figure(ev["figure"]),
                ]
                for ev in e["evidence"]
            ],
            [u["note"] for u in e["untested"]],
            [[name(c["release"]), name(c["status"]), name(c["verdict"])] for c in e["releases"]],
        ]
        for e in data["entries"]
    ]
    return {"strings": strings, "entries": entries, "arches": data["arches"], "gpus": data["gpus"]}


def index_script(data: dict) -> str:
    """``data/index.js``: the compact index as a string that the page reads with ``JSON.parse``, several times
    faster than a script parses the same object literal. Single-quoted, so JSON's own quotes need no escape."""
    text = json.dumps(compact_index(data), separators=(",", ":"), ensure_ascii=False)
    quoted = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"window.SPECPILOT_INDEX = JSON.parse('{quoted}');\n"


def index_page(data: dict, releases: list[str]) -> str:
    options = "".join(f'<option value="{escape(r)}">{escape(r)}</option>' for r in releases)
    form = (
        '<form id="query" class="query" autocomplete="off">'
        '<label>GPU or arch <input name="gpu" placeholder="H200, sm_90"></label>'
        '<label>model <input name="model" placeholder="Qwen3.8-27B"></label>'
        '<label>drafter <input name="drafter" placeholder="EAGLE-3"></label>'
        '<label>regime <select name="regime"><option value="">any</option><option>single</option><option>batch</option></select></label>'
        '<label>status <select name="status"><option value="">any</option><option>verified</option><option>candidate</option>'
        "<option>superseded</option><option>unchecked</option></select></label>"
        f'<label>on release <select name="release"><option value="">its own</option>{options}</select></label>'
        '<label>requires <input name="requires" placeholder="entry id"></label>'
        '<label>words <input name="text" placeholder="lm head"></label>'
        '<label class="check"><input type="checkbox" name="validated"> validated only</label>'
        '<button type="submit">Query</button> <button type="reset">Clear</button></form>'
        '<p id="query-error" class="bad-text" hidden></p><p id="count" class="muted"></p>'
    )
    head = "".join(
        f"<th>{h}</th>" for h in ("entry", "status", "releases", "hardware", "best evidence", "untested", "requires")
    )
    body = (
        f"<h1>Entries</h1><p>{len(data['entries'])} entries. The query form filters the registry's rows as "
        "<code>specpilot-mem query</code> does.</p>"
        + form
        + f'<table id="results"><thead><tr>{head}</tr></thead><tbody></tbody></table>'
        '<button id="more" type="button" hidden></button>'
    )
    return _page("Entries", body, scripts=("data/index.js", "static/query.js"))


def graph_page(records: dict[str, EntryRecord]) -> str:
    ids = _order(records, records)
    body = (
        f"<h1>Requirement graph</h1><p>{len(ids)} entries in columns by depth; a line joins an entry to what it "
        "requires, in a column to its left (entries in the first column require only stock). Colours give each "
        "entry's status.</p>"
        f'<div class="scroll">{dag_svg(ids, records, "entries/%s.html")}</div>'
    )
    return _page("Requirement graph", body)


RELEASE_ROWS = 100  # entries on one page of the release matrix: laying out a thousand rows is most of a page's load


def release_pages(records: dict[str, EntryRecord]) -> dict[str, str]:
    """The status of every entry on every release, ``RELEASE_ROWS`` entries a page: {page name: HTML}."""
    releases = _releases(records)
    ids = sorted(records)
    starts = range(0, max(len(ids), 1), RELEASE_ROWS)
    names = ["releases.html" if n == 0 else f"releases-{n + 1}.html" for n in range(len(starts))]
    pages = {}
    for n, start in enumerate(starts):
        rows = []
        for entry_id in ids[start : start + RELEASE_ROWS]:
            record = records[entry_id]
            cells = [f'<a href="entries/{escape(entry_id)}.html">{escape(entry_id)}</a>']
            for release in releases:
                check = record.release_check(release)
                if release == record.scope.sglang:
                    cells.append(f'<span class="{STATUS_CLASS[record.status]}">{record.status} (its own)</span>')
                elif check:
                    cells.append(
                        f'<a class="{STATUS_CLASS[check.status]}" href="entries/{escape(entry_id)}.html#release-'
                        f'{escape(release)}">{check.status} · {check.verdict}{" · port" if check.port else ""}</a>'
                    )
                else:
                    cells.append('<span class="muted">unchecked</span>')
            rows.append(cells)
        shown = f"entries {start + 1}–{min(start + RELEASE_ROWS, len(ids))} of {len(ids)}" if ids else "no entries"
        nav = (
            '<p class="pages">'
            + shown
            + (
                " · page "
                + " ".join(
                    f"<b>{k + 1}</b>" if k == n else f'<a href="{name}">{k + 1}</a>' for k, name in enumerate(names)
                )
                if len(names) > 1
                else ""
            )
            + "</p>"
        )
        body = (
            "<h1>Status on every SGLang release</h1><p>Each entry's status on the release it was validated on, "
            "and the verdict and status <code>specpilot-mem revalidate</code> or <code>port</code> left on the "
            "others.</p>"
            + nav
            + _table(["entry"] + [escape(r) for r in releases], rows, "matrix")
            + (nav if len(names) > 1 else "")
        )
        pages[names[n]] = _page("Releases" if n == 0 else f"Releases, page {n + 1}", body)
    return pages


def build_site(home: Home, out: Path) -> BuildReport:
    """Write the site into ``out`` (built beside it, then moved into place: a failed build leaves ``out`` as it was)."""
    started = time.perf_counter()
    out = Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file())):
        raise SpecPilotError(
            f"{out} exists and is not a site this command built",
            where="--out",
            fix="pass a new or empty folder (a built site is replaced whole)",
        )
    data, records = index_data(home)
    required_by: dict[str, list[str]] = {i: [] for i in records}
    for entry_id, record in records.items():
        for req in record.requires:
            required_by[req].append(entry_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}-build-", dir=out.parent))
    pages, plots = [], 0
    try:
        (build / "entries").mkdir()
        (build / "data").mkdir()
        shutil.copytree(STATIC, build / "static")
        (build / MARKER).write_text("built by specpilot-mem browse\n")
        (build / "data" / "index.js").write_text(index_script(data))
        for name, html in (
            ("index.html", index_page(data, _releases(records))),
            ("graph.html", graph_page(records)),
            *release_pages(records).items(),
        ):
            (build / name).write_text(html)
            pages.append(name)
        for entry_id, record in records.items():
            html, count = entry_page(home, record, records, sorted(required_by[entry_id]))
            (build / "entries" / f"{entry_id}.html").write_text(html)
            pages.append(f"entries/{entry_id}.html")
            plots += count
        replace_folder(build, out)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return BuildReport(out, len(records), pages, plots, time.perf_counter() - started)
