"""The results catalogue in headless Chromium, opened from file:// with no server: every image
loads, every link resolves, nothing is fetched from the network. With MLSYS_FLOWS_SAVE_SCREENSHOTS=1
it refreshes docs/img/results-catalogue.png."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from mlsys_flows import registry
from mlsys_flows.docsgen import catalogue

pytestmark = pytest.mark.integration
CHROMIUM = "/usr/bin/chromium"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
IMAGES_LOADED = "() => Array.from(document.images).every(i => i.complete)"
BROKEN_IMAGES = "() => Array.from(document.images).filter(i => !(i.naturalWidth > 0)).map(i => i.src)"
LINKS = "() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
# pixels a page is wider than the window: tables wrap their cells to fit rather than overflow
OVERFLOW = "() => document.documentElement.scrollWidth - window.innerWidth"
# number cells in scientific notation (3.489e+04, -1.836e-10)
SCIENTIFIC = r"() => Array.from(document.querySelectorAll('td.num')).map(td => td.innerText)" \
             r".filter(t => /\d(\.\d+)?e[+-]\d/i.test(t))"
# a system page's comparisons as (name without its labels, baseline value, technique value): each once
CLAIM_KEYS = """() => { const h = Array.from(document.querySelectorAll('h2')).find(e => e.textContent.startsWith('Run '));
  if (!h) return []; let t = h.nextElementSibling; while (t.tagName !== 'TABLE') t = t.nextElementSibling;
  return Array.from(t.tBodies[0].rows).map(r => [r.cells[0].innerText.split(/ \\(|, /)[0], r.cells[2].innerText,
                                                 r.cells[3].innerText].join(' | ')); }"""


def test_catalogue_opens_from_a_file_with_every_image_and_link(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium; `make system-deps`)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    index = catalogue.build(tmp_path / "catalogue")
    root = index.parent.resolve()
    outside: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            # no server, no network: anything but a file under the catalogue is refused and recorded
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(root.as_uri())
                       else (outside.append(route.request.url), route.abort()))
            page.goto(index.as_uri(), wait_until="load")
            page.wait_for_function(IMAGES_LOADED, timeout=30_000)
            rows = page.locator("tbody tr").count()
            thumbs = page.locator("img.thumb").count()
            broken = page.evaluate(BROKEN_IMAGES)
            overflow = {"index.html": page.evaluate(OVERFLOW)}
            scientific = page.evaluate(SCIENTIFIC)
            duplicated = []
            links = sorted(set(page.evaluate(LINKS)))
            shot = tmp_path / "results-catalogue.png"
            page.screenshot(path=str(shot))
            visited = []
            for link in links:  # every link: a file of the catalogue, whose page loads with its images
                path = Path(unquote(urlparse(link).path))
                assert link.startswith("file://") and path.is_file() and root in path.parents, link
                page.goto(link, wait_until="load")
                page.wait_for_function(IMAGES_LOADED, timeout=30_000)
                broken += page.evaluate(BROKEN_IMAGES)
                overflow[path.name] = page.evaluate(OVERFLOW)
                scientific += page.evaluate(SCIENTIFIC)
                keys = page.evaluate(CLAIM_KEYS)
                duplicated += [(path.name, k) for k in set(keys) if keys.count(k) > 1]
                for sub in page.evaluate(LINKS):
                    assert Path(unquote(urlparse(sub).path)).is_file(), (link, sub)
                visited.append(path.name)
            # broken on purpose: a missing thumbnail is seen
            page.goto(index.as_uri(), wait_until="load")
            Path(unquote(urlparse(page.evaluate("() => document.querySelector('img.thumb').src")).path)).unlink()
            page.reload(wait_until="load")
            page.wait_for_function(IMAGES_LOADED, timeout=30_000)
            assert len(page.evaluate(BROKEN_IMAGES)) == 1
        finally:
            browser.close()
    assert rows >= len(registry.names())
    assert thumbs == sum(1 for s in registry.all_specs() if catalogue.collect(history=False).get(s.name))
    assert broken == [] and outside == []
    assert {name: px for name, px in overflow.items() if px > 0} == {}
    assert scientific == [] and duplicated == []
    assert {f"{n}.html" for n in registry.names()} <= set(visited)
    assert shot.stat().st_size > 20_000
    if os.environ.get("MLSYS_FLOWS_SAVE_SCREENSHOTS"):  # refresh the docs' picture
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, DOCS_IMG / "results-catalogue.png")
