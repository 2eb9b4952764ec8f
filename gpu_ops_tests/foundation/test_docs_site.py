"""The manual as a reader opens it: the site, built once (strict) into a temporary folder,
works opened from disk (``file://.../index.html``), where a link to a folder shows a
directory listing instead of the page, as well as served (``mkdocs serve``).

- every relative ``href``/``src`` of every built page is a file of the site (and its
  ``#anchor`` an id in that file); README.md's relative links are files and headings;
- the Python API pages render each name of ``gpu_ops.__all__`` with its docstring, every
  member shown has documentation, no private name appears, and each page's table of
  contents lists its objects only;
- headless Chromium (Debian's ``chromium``, as the UI screenshot test) opens the site from
  disk, follows the home page's link to Getting started and finds that page, searches
  from disk, and takes pictures of "Train on spot" and of a search opened from disk and
  of an API page (into ``$GPU_OPS_SCREENSHOTS``, ``make screenshots``: docs/images;
  otherwise the test's temporary folder)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from markdown_it import MarkdownIt

import gpu_ops
from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.demo.test_screenshots import HEIGHT, WIDTH, chromium, png_size_and_colours, shoot

LINK_ATTRS = {("a", "href"), ("link", "href"), ("script", "src"), ("img", "src"), ("source", "src")}


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make docs`` into a temporary folder (about 8 s)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    return out


class _Page(HTMLParser):
    """The links (tag, attribute, value) and element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if (tag, name) in LINK_ATTRS and value:
                self.links.append(value)


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def is_relative(url: str) -> bool:
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc and not url.startswith("/")


def link_problems(root: Path) -> list[str]:
    """Each relative link of each page of the site at ``root`` that a browser opened from
    disk cannot follow: a missing file, a folder (a directory listing), an unknown anchor."""
    pages = {path: parse(path) for path in root.rglob("*.html") if path.name != "404.html"}  # 404.html is served for any path: its links are absolute
    problems = []
    for path, page in sorted(pages.items()):
        for url in page.links:
            if not is_relative(url) or url == "#" or (url.startswith("#") and url[1:] in page.ids):
                continue
            parts = urlsplit(urljoin(path.as_uri(), url))
            target = Path(unquote(parts.path))
            where = f"{path.relative_to(root)}: {url}"
            if not target.is_relative_to(root):
                problems.append(f"{where} leaves the site")
            elif target.is_dir():
                problems.append(f"{where} is a folder: opened from disk, a browser lists it instead of showing a page")
            elif not target.is_file():
                problems.append(f"{where} is no file")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in (pages.get(target) or parse(target)).ids:
                problems.append(f"{where}: no element has that id")
    return problems


def test_the_link_check_finds_folders_missing_files_and_anchors(tmp_path: Path):
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "index.html").write_text('<h1 id="top">Guide</h1>')
    (tmp_path / "index.html").write_text(
        '<a href="guide/">folder</a><a href="guide/index.html#top">ok</a><a href="guide/index.html#nowhere">anchor</a>'
        '<img src="missing.png"><a href="#">top</a><a href="https://example.org/x/">out</a><script src="../up.js"></script>'
    )
    assert link_problems(tmp_path) == [
        "index.html: guide/ is a folder: opened from disk, a browser lists it instead of showing a page",
        "index.html: guide/index.html#nowhere: no element has that id",
        "index.html: missing.png is no file",
        "index.html: ../up.js leaves the site",
    ]


def test_every_relative_link_of_the_built_site_opens_from_disk(site: Path):
    sources = {str(md.relative_to(REPO / "docs").with_suffix(".html")) for md in (REPO / "docs").rglob("*.md")}
    assert sources <= {str(html.relative_to(site)) for html in site.rglob("*.html")}  # getting-started.html, not getting-started/index.html
    assert link_problems(site) == []
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin: search without a server


def github_slug(heading: str) -> str:
    """The anchor GitHub (and the toc extension) gives a heading: lower case, punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def headings(markdown: str) -> set[str]:
    tokens = MarkdownIt("commonmark").parse(markdown)
    return {github_slug(tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"}


def markdown_links(markdown: str) -> list[str]:
    found = []
    for token in MarkdownIt("commonmark").parse(markdown):
        for child in token.children or []:
            url = child.attrGet("href") if child.type == "link_open" else child.attrGet("src") if child.type == "image" else None
            if isinstance(url, str):
                found.append(url)
    return found


def test_the_readme_links_point_at_files_and_headings():
    readme = (REPO / "README.md").read_text()
    links = [url for url in markdown_links(readme) if is_relative(url)]
    assert len(links) > 15
    problems = []
    for url in links:
        parts = urlsplit(url)
        target = REPO / unquote(parts.path)
        if not target.exists():
            problems.append(f"{url}: no such file")
        elif parts.fragment and parts.fragment not in headings(target.read_text()):
            problems.append(f"{url}: {target.name} has no such heading")
    assert problems == []
    # "what each figure means": the page that lists the training asset's metadata keys
    (figures,) = [url for url in links if "#" in url and "train-on-spot" in url]
    section = (REPO / figures.split("#")[0]).read_text().split("## When an attempt ends", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{key}`" in section for key in ("attempts", "preemptions", "gpu_hours", "cost_usd"))


API = "reference/api"


def api_objects(html: str) -> list[tuple[int, str, str]]:
    """(heading level, id, text of its own documentation) of each object an API page
    renders: what its contents say besides its signature and bases, up to the next object."""
    objects = []
    for chunk in html.split("</article>", 1)[0].split('<div class="doc doc-object')[1:]:
        found = re.search(r'<h(\d) id="([^"]+)" class="doc doc-heading"', chunk)
        assert found, chunk[:300]
        contents = chunk.split('class="doc doc-contents', 1)[-1].split(">", 1)[-1]
        contents = re.sub(r'<p class="doc doc-class-bases">.*?</p>', "", contents, flags=re.S)
        objects.append((int(found[1]), found[2], re.sub(r"<[^>]+>|&para;", "", contents).strip()))
    return objects


def test_the_api_pages_document_every_public_name_and_nothing_else(site: Path):
    pages = sorted((site / API).glob("*.html"))
    assert {p.stem for p in pages} >= {"index", "training", "compute", "config-and-storage", "cost", "alerts", "errors"}
    rendered: dict[str, str] = {}
    undocumented, private = [], []
    for page in pages:
        html = page.read_text()
        objects = api_objects(html)
        undocumented += [name for _, name, text in objects if not text]
        private += [name for _, name, _ in objects if re.search(r"\._", name)]
        tops = [name for level, name, _ in objects if level == 2]  # each ::: on the page; members are h3 and below
        rendered.update({name.rsplit(".", 1)[-1]: page.name for name in tops})
        if tops:
            toc = html.split('class="md-nav md-nav--secondary"', 1)[1].split("</nav>", 1)[0]
            entries = re.findall(r'<a href="#([^"]+)" class="md-nav__link">', toc)
            assert entries == tops, f"{page.name}: its table of contents lists other entries than its objects"
    assert not undocumented, f"rendered without documentation: {undocumented}"
    assert not private, f"private names shown: {private}"
    assert sorted(set(gpu_ops.__all__) - set(rendered)) == []


def dump_dom(browser: str, url: str, timeout_s: float = 90) -> str:
    """The page's DOM after its scripts ran (headless Chromium's ``--dump-dom``); a browser
    that hangs is killed with every process it started."""
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom", url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"headless Chromium gave no DOM of {url} in {timeout_s:.0f} s")
    assert proc.returncode == 0, err[-2000:]
    return out


def test_the_site_opened_from_disk_follows_links_and_searches(site: Path, tmp_path: Path):
    browser = chromium()
    home = (site / "index.html").as_uri()
    # The home page's nav link to Getting started, followed as a click follows it.
    links = re.findall(r'<a href="([^"]+)" class="md-nav__link">\s*<span class="md-ellipsis">\s*Getting started\s*</span>', dump_dom(browser, home))
    assert links, "the home page has no nav link to Getting started"
    page_url = urljoin(home, links[0])
    page = dump_dom(browser, page_url)
    assert "Index of" not in page and re.search(r"<h1[^>]*>Getting started", page), f"{page_url} did not render the page:\n{page[:1500]}"
    # Search from disk: the index inlined by the offline plugin, the worker in an iframe.
    found = dump_dom(browser, f"{home}?q=preemption")
    assert re.search(r'md-search-result__meta">\d+ matching documents', found), "no search results when opened from disk"

    out_dir = Path(os.environ.get("GPU_OPS_SCREENSHOTS") or tmp_path / "shots")
    out_dir = out_dir if out_dir.is_absolute() else REPO / out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    shots = {
        "docs-from-disk.png": urljoin(home, "how-to/train-on-spot.html"),  # its long code lines wrap, none cut off
        "docs-search-from-disk.png": f"{home}?q=preemption",
        "docs-api-training.png": (site / API / "training.html").as_uri(),
    }
    for name, url in shots.items():
        shoot(browser, url, out_dir / name)
        width, height, colours = png_size_and_colours(out_dir / name)
        assert (width, height) == (WIDTH, HEIGHT) and colours > 40, name
