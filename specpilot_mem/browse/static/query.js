// The query form over the registry's rows (data/index.js): the semantics of `specpilot-mem query`
// (specpilot_mem/registry/query.py) — an entry matches a GPU or arch when fitting evidence was measured on
// that arch or a variant is built for it; evidence fits when its target, drafter and regime match (names
// compared lower-case, letters and digits only, as substrings); every word must appear in the title,
// summary or limits; the status is the one on the chosen release (its own release by default).
"use strict";
(function () {
  // data/index.js holds lists in a fixed field order and names as indices into one table
  // (specpilot_mem/browse/site.py, compact_index); read back into the cards the query works on.
  function expand(index) {
    const s = index.strings;
    const name = (i) => (i < 0 ? null : s[i]);
    const figure = (f) => (f === 0 ? null : { name: name(f[0]), value: f[1], unit: name(f[2]), ci_low: f[3], ci_high: f[4] });
    const entries = index.entries.map((e) => ({
      id: e[0], title: e[1], validated: e[2] === 1, status: name(e[3]), sglang: name(e[4]), text: e[5], requires: e[6],
      variants: e[7].map((v) => ({ name: v[0], hardware: v[1].map(name) })),
      evidence: e[8].map((ev) => ({
        idx: ev[0], kind: name(ev[1]), gpu: name(ev[2]), gpu_name: name(ev[3]), arch: name(ev[4]), target: name(ev[5]),
        drafter: name(ev[6]), regime: name(ev[7]), synthetic: ev[8] === 1, date: name(ev[9]), figure: figure(ev[10]),
      })),
      untested: e[9].map((note) => ({ note })),
      releases: e[10].map((c) => ({ release: name(c[0]), status: name(c[1]), verdict: name(c[2]) })),
    }));
    return { entries, arches: index.arches, gpus: index.gpus };
  }
  const DATA = expand(window.SPECPILOT_INDEX);
  const HARDWARE_RANK = { gpu: 0, arch: 1, variant: 2, none: 3 };
  const STATUS_RANK = { verified: 0, candidate: 1, unchecked: 2, superseded: 3 };
  const STATUS_CLASS = { verified: "ok", candidate: "warn", superseded: "info", unchecked: "muted" };
  const VERDICT_CLASS = { clean: "ok", drift: "warn", conflict: "bad", superseded: "info", blocked: "bad" };
  const byId = new Map(DATA.entries.map((e) => [e.id, e]));

  function nameKey(text) {
    return (text || "").toLowerCase().replace(/[^\p{L}\p{N}]/gu, "");
  }
  function esc(text) {
    return String(text == null ? "" : text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function hardware(text) {
    const lowered = text.trim().toLowerCase();
    if (!lowered) return { gpu: null, arch: null };
    if (lowered.startsWith("sm_")) {
      if (!DATA.arches.includes(lowered)) throw new Error(`unknown arch ${text}: use one of ${DATA.arches.join(", ")}`);
      return { gpu: null, arch: lowered };
    }
    const wanted = nameKey(text);
    const gpu = DATA.gpus.find((g) => [g.name, ...g.aliases].some((n) => nameKey(n) === wanted));
    if (!gpu) throw new Error(`unknown GPU ${text}: use one of ${DATA.gpus.map((g) => g.name).join(", ")}`);
    return { gpu, arch: gpu.arch };
  }
  function closureHolds(entry, wanted, seen = new Set()) {
    for (const req of entry.requires) {
      if (req === wanted) return true;
      if (!seen.has(req) && byId.has(req)) {
        seen.add(req);
        if (closureHolds(byId.get(req), wanted, seen)) return true;
      }
    }
    return false;
  }
  function statusOn(entry, release) {
    if (!release || entry.sglang === release) return entry.status;
    const check = entry.releases.find((r) => r.release === release);
    return check ? check.status : "unchecked";
  }

  function query(f) {
    const { gpu, arch } = hardware(f.gpu || "");
    if (f.requires && !byId.has(f.requires)) throw new Error(`unknown entry: ${f.requires}`);
    if (f.status === "unchecked" && !f.release) throw new Error("status unchecked needs a release");
    const model = nameKey(f.model), drafter = nameKey(f.drafter);
    const settingGiven = Boolean(f.model || f.drafter || f.regime);
    const words = (f.text || "").toLowerCase().split(/\s+/).filter(Boolean);
    const out = [];
    for (const e of DATA.entries) {
      const fit = e.evidence.filter((ev) => (!model || nameKey(ev.target).includes(model))
        && (!drafter || nameKey(ev.drafter).includes(drafter)) && (!f.regime || ev.regime === f.regime));
      if (arch) {
        const measured = fit.some((ev) => ev.arch === arch);
        const variant = e.variants.some((v) => v.hardware.includes(arch)) && (!settingGiven || fit.length > 0);
        if (!measured && !variant) continue;
      } else if (settingGiven && fit.length === 0) continue;
      if (!words.every((w) => e.text.includes(w))) continue;
      if (f.validated && !e.validated) continue;
      if (f.requires && !closureHolds(e, f.requires)) continue;
      const status = statusOn(e, f.release);
      if (f.status && status !== f.status) continue;
      out.push(describe(e, fit, gpu, arch, status));
    }
    out.sort((a, b) => HARDWARE_RANK[a.hardware] - HARDWARE_RANK[b.hardware]
      || STATUS_RANK[a.status] - STATUS_RANK[b.status] || (b.entry.validated - a.entry.validated)
      || (a.entry.id < b.entry.id ? -1 : a.entry.id > b.entry.id ? 1 : 0));
    return out;
  }

  function describe(e, fit, gpu, arch, status) {
    let hardware = "none", note = "", pool = fit;
    const onArch = fit.filter((ev) => ev.arch === arch);
    const onGpu = onArch.filter((ev) => gpu && ev.gpu_name === gpu.name);
    if (arch === null) {
      pool = fit;
    } else if (onGpu.length) {
      hardware = "gpu"; note = `measured on ${gpu.name}`; pool = onGpu;
    } else if (onArch.length) {
      hardware = "arch"; pool = onArch;
      note = `measured on ${[...new Set(onArch.map((ev) => ev.gpu))].sort().join(", ")} (${arch})` + (gpu ? `, not on ${gpu.name}` : "");
    } else {
      hardware = "variant";
      note = `variant ${e.variants.filter((v) => v.hardware.includes(arch)).map((v) => v.name).join(", ")} built for ${arch}`;
    }
    let best = null;
    for (const ev of pool) {
      const key = [ev.kind === "paired-run", !ev.synthetic, ev.date, -ev.idx];
      if (!best || compare(key, best.key) > 0) best = { ev, key };
    }
    return { entry: e, hardware, note, status, best: best && best.ev, fitCount: fit.length };
  }
  function compare(a, b) {
    for (let i = 0; i < a.length; i++) { if (a[i] < b[i]) return -1; if (a[i] > b[i]) return 1; }
    return 0;
  }

  function headline(ev) {
    if (!ev.figure) return ev.kind;
    const f = ev.figure;
    const ci = f.ci_low != null && f.ci_high != null ? ` [${f.ci_low}, ${f.ci_high}]` : "";
    return `${f.name} ${f.value}${f.unit}${ci}`;
  }
  // Rows beyond the first page are rendered on request: building a thousand rows' DOM costs the page its load time.
  const PAGE_ROWS = 50;
  let shown = [];
  function render(rows, limit = PAGE_ROWS) {
    shown = rows;
    const body = document.querySelector("#results tbody");
    const html = [];
    for (const r of rows.slice(0, limit)) {
      const e = r.entry;
      const releases = e.releases.map((c) => `<span class="badge ${VERDICT_CLASS[c.verdict]}" title="${esc(c.verdict)}">${esc(c.release)}: ${esc(c.status)}</span>`).join(" ");
      const best = r.best ? `${esc(headline(r.best))} <span class="muted">${esc(r.best.kind)}${r.best.synthetic ? " (synthetic)" : ""} · ${esc(r.best.gpu)}</span>` : "";
      html.push(`<tr data-id="${esc(e.id)}"><td><a href="entries/${encodeURIComponent(e.id)}.html">${esc(e.id)}</a><br>${esc(e.title)}${e.validated ? ' <span class="badge ok">validated</span>' : ""}</td>`
        + `<td><span class="badge ${STATUS_CLASS[r.status]}">${esc(r.status)}</span><br><span class="muted">${esc(e.sglang || "")}</span></td>`
        + `<td>${releases}</td><td>${r.hardware === "none" ? "" : esc(r.note)}</td><td>${best}</td>`
        + `<td>${e.untested.map((u) => esc(u.note)).join("<br>")}</td><td>${e.requires.map(esc).join(", ")}</td></tr>`);
    }
    body.innerHTML = html.join("");
    const more = document.getElementById("more");
    more.hidden = rows.length <= limit;
    more.textContent = `show all ${rows.length}`;
    document.getElementById("count").textContent = `${rows.length} of ${DATA.entries.length} entries`
      + (rows.length > limit ? ` (the first ${limit} shown)` : "");
  }

  function filtersOf(form) {
    const data = new FormData(form);
    const f = {};
    for (const key of ["gpu", "model", "drafter", "regime", "status", "release", "requires", "text"]) f[key] = (data.get(key) || "").trim();
    f.validated = data.get("validated") === "on";
    return f;
  }
  function run(form) {
    const error = document.getElementById("query-error");
    try {
      render(query(filtersOf(form)));
      error.hidden = true;
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
      render([]);
    }
  }

  window.SPECPILOT_QUERY = query;  // for tests and the console
  const form = document.getElementById("query");
  const params = new URLSearchParams(window.location.search);
  for (const [key, value] of params) {
    const field = form.elements.namedItem(key);
    if (field && field.type === "checkbox") field.checked = value === "1" || value === "on";
    else if (field) field.value = value;
  }
  form.addEventListener("submit", (event) => { event.preventDefault(); run(form); });
  document.getElementById("more").addEventListener("click", () => render(shown, shown.length));
  form.addEventListener("reset", () => setTimeout(() => run(form), 0));
  run(form);
})();
