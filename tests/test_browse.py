"""The memory browser: the site built for this project's entries plus a synthetic memory, its links and plots,
and the pages in a real headless chromium (Debian's chromium + chromium-driver, through selenium): no
console errors, links that resolve, a query form that filters exactly as `specpilot-mem query`, and
screenshots with content on them."""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from specpilot_mem.browse.headless import chromium_driver, missing_browser
from specpilot_mem.browse.site import build_site
from specpilot_mem.home import Home
from specpilot_mem.main import main
from specpilot_mem.registry.query import QueryFilters, query_entries
from specpilot_mem.registry.sync import connect
from specpilot_mem.registry.synthetic import generate_memory

PROJECT = Path(__file__).resolve().parents[1]
SYNTHETIC = 60
ENTRIES = SYNTHETIC + len(list((PROJECT / "entries").glob("*/entry.yaml")))  # this project's and the synthetic ones


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A home with this project's entries (their results files linked in) and synthetic ones, and its site."""
    root = tmp_path_factory.mktemp("browse-home")
    generate_memory(root, SYNTHETIC, seed=1, results=True)
    for record in sorted((PROJECT / "entries").glob("*/entry.yaml")):
        shutil.copytree(
            record.parent,
            root / "entries" / record.parent.name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "src"),
        )
    for name in ("benchmarks/results",):
        for path in (PROJECT / name).glob("*.json"):
            (root / name).mkdir(parents=True, exist_ok=True)
            if not (root / name / path.name).exists():
                (root / name / path.name).symlink_to(path)
    home = Home(root)
    report = build_site(home, root / "site")
    return home, report


def test_every_page_is_written_and_every_link_resolves(site):
    _home, report = site
    assert report.entries == ENTRIES and len(report.pages) == ENTRIES + 3  # index, graph, one release page
    for page in report.pages:
        path = report.out / page
        html = path.read_text()
        for target in re.findall(r'(?:href|src)="([^"]+)"', html):
            if target.startswith(("data:", "http://www.w3.org", "#")):
                continue
            resolved = (path.parent / unquote(urlparse(target).path)).resolve()
            assert resolved.is_file(), f"{page} links to {target}"
            fragment = urlparse(target).fragment
            if fragment:
                assert f'id="{fragment}"' in resolved.read_text(), f"{page} links to a missing anchor {target}"


def test_entry_pages_show_the_record_and_plot_the_evidence(site):
    from specpilot_mem.store.records import load_entries

    home, report = site
    w12 = (report.out / "entries/w12.html").read_text()
    for part in (
        "Scope and status",
        "Per-release status",
        "--specpilot-w12-lm-head",
        "Contract",
        "Limits",
        "Untested",
        "speedup by row count",
        "options.html",
    ):
        assert part in w12, part
    checked = {i: r for i, r in load_entries(home).items() if r.releases and not i.startswith("syn-")}
    assert checked  # this project's entries carry release checks (revalidate / port)
    for entry_id, record in checked.items():
        page = (report.out / "entries" / f"{entry_id}.html").read_text()
        assert all(f'id="release-{c.release}"' in page for c in record.releases), entry_id
    syn = sorted(p.name for p in (report.out / "entries").glob("syn-*.html"))
    kinds = {
        kind: [n for n in syn if kind in (report.out / "entries" / n).read_text()]
        for kind in ("τ(N)", "token forcing", "speedup by row count")
    }
    assert all(kinds.values()), kinds
    replay = (report.out / "entries" / kinds["τ(N)"][0]).read_text()
    assert "<polyline" in replay and "best-first" in replay
    forcing = (report.out / "entries" / kinds["token forcing"][0]).read_text()
    assert forcing.count("<rect") > 3 and "injected-fault" in forcing


def test_the_release_matrix_is_paged_and_every_entry_is_on_one_page(site, tmp_path, monkeypatch):
    from specpilot_mem.browse import site as site_module

    home, _ = site
    monkeypatch.setattr(site_module, "RELEASE_ROWS", 25)
    report = build_site(home, tmp_path / "paged")
    pages = [p for p in report.pages if p.startswith("releases")]
    count = -(-ENTRIES // 25)
    assert count >= 3 and pages == ["releases.html"] + [f"releases-{n}.html" for n in range(2, count + 1)]
    listed = []
    for page in pages:
        html = (report.out / page).read_text()
        listed += re.findall(r'<tr><td><a href="entries/([^"]+)\.html">', html)
        assert all(f'href="{other}"' in html for other in pages if other != page)  # links to the other pages
    assert listed == sorted(
        page.removeprefix("entries/").removesuffix(".html") for page in report.pages if page.startswith("entries/")
    )
    last = 25 * (count - 1) + 1
    assert f"entries {last}–{ENTRIES} of {ENTRIES}" in (report.out / pages[-1]).read_text()


def test_browse_command_refuses_a_folder_it_did_not_build(site, tmp_path, capsys):
    home, _ = site
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["browse", "--home", str(home.root), "--json", "--out", str(tmp_path / "mine")]) == 2
    assert "is not a site this command built" in capsys.readouterr().out
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert main(["browse", "--home", str(home.root), "--json", "--out", str(tmp_path / "fresh")]) == 0
    assert (tmp_path / "fresh" / "index.html").is_file()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    driver = chromium_driver(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


def screenshot_has_content(png: bytes) -> tuple[float, int]:
    """(fraction of pixels unlike the commonest colour, distinct colours) of a screenshot."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = image.getcolors(maxcolors=1 << 24)
    return 1 - max(n for n, _ in counts) / (image.width * image.height), len(counts)


def errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


@pytest.mark.browser
def test_pages_load_without_errors_and_show_content(site, browser, tmp_path):
    _, report = site
    pages = ["index.html", "graph.html", "releases.html", "entries/w12.html", "entries/gdn-tree.html"]
    pages += [p for p in report.pages if p.startswith("entries/syn-")][:6]
    for page in pages:
        browser.get((report.out / page).as_uri())
        assert browser.execute_script("return document.readyState") == "complete"
        assert errors(browser) == [], page
        png = browser.get_screenshot_as_png()
        (tmp_path / page.replace("/", "_")).with_suffix(".png").write_bytes(png)
        covered, colours = screenshot_has_content(png)
        assert covered > 0.03 and colours > 20, (page, covered, colours)
    browser.get((report.out / "entries/w12.html").as_uri())
    assert browser.execute_script("return document.querySelectorAll('svg.plot').length") >= 1


@pytest.mark.browser
def test_links_resolve_in_the_browser(site, browser):
    _, report = site
    browser.get((report.out / "index.html").as_uri())
    browser.find_element("id", "more").click()  # every row, not the first page alone
    hrefs = browser.execute_script("return [...document.querySelectorAll('a[href]')].map(a => a.href)")
    assert len(hrefs) >= ENTRIES + 3
    for href in hrefs:
        assert Path(unquote(urlparse(href).path)).is_file(), href
    browser.find_element("css selector", 'a[href="entries/w12.html"]').click()
    assert browser.title.startswith("w12") and errors(browser) == []
    browser.find_element("link text", "options").click()
    assert browser.title.startswith("options")


FILTERS = [
    {},
    {"gpu": "H200"},
    {"gpu": "sm_120"},
    {"status": "verified"},
    {"status": "superseded"},
    {"release": "0.5.20", "status": "candidate"},
    {"release": "0.5.22", "status": "unchecked"},
    {"gpu": "H100", "regime": "batch", "model": "qwen3.8"},
    {"drafter": "eagle", "status": "verified"},
    {"text": "lossless weight"},
    {"requires": "options"},
    {"gpu": "B200", "validated": True},
]


@pytest.mark.browser
@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "all")
def test_the_query_form_filters_as_the_registry_does(site, browser, filters):
    home, report = site
    con = connect(home)
    try:
        expected = [
            m.id
            for m in query_entries(
                con,
                QueryFilters(
                    gpu=filters.get("gpu"),
                    model=filters.get("model"),
                    drafter=filters.get("drafter"),
                    regime=filters.get("regime"),
                    requires=filters.get("requires"),
                    text=filters.get("text"),
                    validated_only=filters.get("validated", False),
                    status=filters.get("status"),
                    release=filters.get("release"),
                ),
            )
        ]
    finally:
        con.close()
    browser.get((report.out / "index.html").as_uri())
    got = browser.execute_script("return SPECPILOT_QUERY(arguments[0]).map(r => r.entry.id)", filters)
    assert got == expected


@pytest.mark.browser
def test_submitting_the_form_filters_the_table(site, browser):
    from selenium.webdriver.support.ui import Select

    _, report = site
    browser.get((report.out / "index.html").as_uri())
    more = browser.find_element("id", "more")
    assert more.is_displayed() and len(browser.find_elements("css selector", "#results tbody tr")) == 50  # a page
    more.click()
    total = len(browser.find_elements("css selector", "#results tbody tr"))
    assert total == ENTRIES and not more.is_displayed()
    form = browser.find_element("id", "query")
    form.find_element("name", "gpu").send_keys("H200")
    Select(form.find_element("name", "status")).select_by_visible_text("verified")
    form.find_element("css selector", "button[type=submit]").click()
    rows = browser.find_elements("css selector", "#results tbody tr")
    assert 0 < len(rows) < total
    assert all("verified" in row.find_elements("tag name", "td")[1].text for row in rows)
    form.find_element("name", "gpu").clear()
    form.find_element("name", "gpu").send_keys("H300")
    form.find_element("css selector", "button[type=submit]").click()
    assert "unknown GPU H300" in browser.find_element("id", "query-error").text
    assert errors(browser) == []


def test_the_site_is_served_on_localhost(site):
    import threading
    import urllib.request

    from specpilot_mem.browse.serve import make_server

    _, report = site
    server = make_server(report.out, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/entries/w12.html", timeout=10) as response:
            assert response.status == 200 and b"Per-release status" in response.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/index.js", timeout=10) as response:
            assert response.read().startswith(b"window.SPECPILOT_INDEX = ")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
