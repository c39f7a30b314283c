"""The explorer page (GET /) in a real Chromium, against the real server serving the committed models.

Debian's `chromium` drives the page through Playwright (its own browser download is not possible here).
Without chromium (or MNEMO_CHROMIUM, the path of another build) the browser tests skip, except in CI
(CI=true), where that is a failure. Screenshots go to tmp/artifacts/explorer/ (or MNEMO_TEST_ARTIFACTS_DIR).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from app.explorer.router import STATIC_DIR

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = Path(os.environ.get("MNEMO_TEST_ARTIFACTS_DIR", ROOT / "tmp" / "artifacts")) / "explorer"
CHROMIUM = os.environ.get("MNEMO_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KT_MODEL = "dkvmn-assist2009"
DKT_MODEL = "dkt-assist2009"
STARTUP_SECONDS = 180


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m app` on a free port serving artifacts/, once /ready answers 200; stopped afterwards."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("explorer-server") / "server.log"
    env = {
        **os.environ,
        "MNEMO_HOST": "127.0.0.1",
        "MNEMO_PORT": str(port),
        "MNEMO_ARTIFACTS_DIR": str(ROOT / "artifacts"),
        "MNEMO_INTRA_OP_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    with log_path.open("wb") as log:
        command = [sys.executable, "-m", "app"]
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"/ready not 200 after {STARTUP_SECONDS} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless; a skip without it, except in CI where it must be there."""
    if not Path(CHROMIUM).exists():
        message = f"no chromium at {CHROMIUM}: install Debian's `chromium` package (or set MNEMO_CHROMIUM)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Watched:
    """A page and what it did: console errors, uncaught exceptions and every URL it requested."""

    def __init__(self, page: Page, origin: str) -> None:
        self.page = page
        self.origin = origin
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.console_errors.append(f"uncaught: {error}"))
        page.on("request", lambda request: self.requests.append(request.url))

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def open(self, fragment: str = "") -> Page:
        self.page.goto(f"{self.origin}/{fragment}")
        expect(self.page.locator("body[data-ready=true]")).to_have_count(1, timeout=30_000)
        return self.page

    def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)

    def assert_clean(self, expected_statuses: tuple[int, ...] = ()) -> None:
        """No console error but Chromium's line for each HTTP error status the test provoked; no foreign URL."""
        failed = [re.search(r"status of (\d+)", text) for text in self.console_errors]
        assert [text for text, status in zip(self.console_errors, failed, strict=True) if not status] == []
        assert [int(status[1]) for status in failed] == list(expected_statuses), self.console_errors
        assert all(url.startswith(self.origin + "/") for url in self.requests), self.requests


@pytest.fixture
def watched(browser: Browser, server: str) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield Watched(context.new_page(), server)
    finally:
        context.close()


def test_similarity_tab_shows_the_api_values_and_maps_of_len_tokens_squared(watched: Watched, server: str):
    pair = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A zorblaxian person plays an instrument."}
    api = httpx.post(f"{server}/similarity", json={**pair, "return_attention": True}, timeout=30).json()
    page = watched.open()
    page.get_by_label("Sentence A").fill(pair["sentence_a"])
    page.get_by_label("Sentence B").fill(pair["sentence_b"])
    page.get_by_role("button", name="Compare").click()
    expect(page.locator("#similarity-result")).to_be_visible()

    relatedness = page.get_by_test_id("relatedness")
    assert relatedness.inner_text() == f"{api['relatedness']:.3f}"
    assert float(relatedness.get_attribute("data-value")) == api["relatedness"]
    assert page.locator("#entailment-label").inner_text() == api["entailment"]["label"].lower()
    for label, probability in api["entailment"]["probabilities"].items():
        assert page.locator("#entailment-bars li", has_text=label.lower()).inner_text().endswith(f"{probability:.1%}")
    assert api["unknown_tokens"] == ["zorblaxian"]
    expect(page.locator("#unknown-tokens")).to_contain_text("zorblaxian")
    for key in ("a", "b"):
        tokens, matrix = api[f"tokens_{key}"], api["attention"][f"sentence_{key}"]
        cells = page.locator(f"#attention-{key} rect.cell")
        expect(cells).to_have_count(len(tokens) ** 2)
        last = cells.nth(len(tokens) ** 2 - 1)
        assert float(last.get_attribute("data-value")) == matrix[-1][-1]
        assert last.locator("title").text_content().endswith(f"{matrix[-1][-1]:.4f}")
        labels = page.locator(f"#attention-{key} svg.heatmap text.label")
        assert labels.all_text_contents()[: len(tokens)] == [t + " ?" if t == "zorblaxian" else t for t in tokens]
    assert page.locator("#attention-b text.label.marked").count() == 2  # its row and its column

    page.locator("#attention-a svg.heatmap").focus()  # the weights by keyboard
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    token, weight = api["tokens_a"][1], api["attention"]["sentence_a"][1][1]
    expect(page.locator("#attention-a .readout")).to_have_text(
        f"reading “{token}” (2), attended to “{token}” (2): {weight:.4f}"
    )
    watched.screenshot("similarity-1280")
    page.get_by_text("Sentence A: attention while reading: the numbers").click()  # the weights as a table
    table_rows = page.locator("#attention-a details table tbody tr")
    expect(table_rows).to_have_count(len(api["tokens_a"]))
    assert table_rows.nth(1).locator("td").nth(1).inner_text() == f"{weight:.3f}"
    page.set_viewport_size({"width": 375, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 375  # nothing wider than a phone
    watched.screenshot("similarity-375")
    watched.assert_clean()


def test_knowledge_tab_builds_a_five_step_history_by_question_name(watched: Watched, server: str):
    catalog = httpx.get(f"{server}/models/{KT_MODEL}/questions", params={"limit": 1000}, timeout=10).json()
    chosen = [item for item in catalog["questions"] if item["name"]][:3]
    steps = [(chosen[0], True), (chosen[1], False), (chosen[0], True), (chosen[2], True), (chosen[1], False)]
    interactions = [{"question": item["question"], "correct": correct} for item, correct in steps]
    api = httpx.post(
        f"{server}/knowledge-trace", json={"model": KT_MODEL, "interactions": interactions}, timeout=30
    ).json()

    page = watched.open()
    page.get_by_role("tab", name="Similarity").focus()
    page.keyboard.press("ArrowRight")  # the tabs by keyboard
    expect(page.get_by_role("tab", name="Knowledge tracing")).to_have_attribute("aria-selected", "true")
    page.locator("#kt-model").select_option(KT_MODEL)
    question = page.get_by_label("Question (type a name or an id)")
    for item, correct in steps:
        question.fill(f"{item['question']} · {item['name']}")
        if correct:
            question.press("Enter")  # Enter adds the answer as right
        else:
            page.get_by_role("button", name="Add: wrong ✗").click()
    expect(page.locator("#history li")).to_have_count(5)
    expect(page.locator("#history li").first).to_contain_text(chosen[0]["name"])
    page.get_by_role("button", name="Trace").click()
    expect(page.locator("#kt-result")).to_be_visible()

    points = page.locator("#prediction-chart circle.point")
    expect(points).to_have_count(5)
    assert [float(value) for value in points.evaluate_all("ps => ps.map(p => p.dataset.value)")] == api["predictions"]
    assert points.evaluate_all("ps => ps.map(p => p.classList.contains('right'))") == [c for _, c in steps]
    n_concepts = api["n_concepts"]
    expect(page.locator("#mastery-map g.row")).to_have_count(6)
    expect(page.locator("#mastery-map rect.cell")).to_have_count(6 * n_concepts)
    assert float(page.locator("#mastery-map rect.cell").last.get_attribute("data-value")) == api["mastery"][5][-1]
    expect(page.locator("#kt-attention-map g.row")).to_have_count(5)
    next_rows = page.locator("#next-table tbody tr")
    expect(next_rows).to_have_count(15)
    best = max(api["next"], key=lambda item: item["p_correct"])
    assert next_rows.first.locator("td").nth(3).inner_text().strip() == f"{best['p_correct']:.3f}"
    page.get_by_role("button", name=f"Show all {len(api['next'])}").click()
    expect(next_rows).to_have_count(len(api["next"]))
    page.get_by_role("button", name="Show the first 15").click()

    watched.screenshot("knowledge-1280")
    page.set_viewport_size({"width": 375, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    watched.screenshot("knowledge-375")
    page.get_by_text("Predicted probability of a right answer, before each step: the numbers").click()
    expect(page.locator("#prediction-chart table tbody tr")).to_have_count(5)
    watched.assert_clean()


def test_knowledge_tab_shows_the_dkt_baseline_without_concept_maps(watched: Watched, server: str):
    """DKT has no memory slots: the page shows its predictions and next questions, and no mastery or attention."""
    interactions = [
        {"question": 12, "correct": True},
        {"question": 7, "correct": False},
        {"question": 12, "correct": True},
    ]
    api = httpx.post(
        f"{server}/knowledge-trace", json={"model": DKT_MODEL, "interactions": interactions}, timeout=30
    ).json()
    page = watched.open("#knowledge")
    page.locator("#kt-model").select_option(DKT_MODEL)
    expect(page.locator("#kt-model-info")).to_contain_text("no latent concepts")
    page.get_by_text("Paste a history").click()
    page.get_by_label("One answer per line").fill("12 1\n7 0\n12 1")
    page.get_by_role("button", name="Replace the history").click()
    page.get_by_role("button", name="Trace").click()
    expect(page.locator("#kt-result")).to_be_visible()
    points = page.locator("#prediction-chart circle.point")
    expect(points).to_have_count(3)
    assert [float(value) for value in points.evaluate_all("ps => ps.map(p => p.dataset.value)")] == api["predictions"]
    expect(page.locator("#mastery-map")).to_be_hidden()
    expect(page.locator("#kt-attention-map")).to_be_hidden()
    expect(page.locator("#next-table tbody tr").first.locator("td").nth(2)).to_have_text("–")
    watched.screenshot("knowledge-dkt-1280")
    watched.assert_clean()


def test_errors_are_shown_in_the_page(watched: Watched, server: str):
    too_long = " ".join(["word"] * 80)
    api = httpx.post(f"{server}/similarity", json={"sentence_a": too_long, "sentence_b": "A cat."}, timeout=30)
    assert api.status_code == 422
    message = api.json()["detail"][0]["msg"]
    page = watched.open()
    page.get_by_label("Sentence A").fill(too_long)
    page.get_by_role("button", name="Compare").click()
    error = page.locator("#similarity-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("422")
    expect(error).to_contain_text(message)
    watched.screenshot("similarity-error")

    watched.open("#knowledge")  # the fragment picks the tab
    page.get_by_text("Paste a history").click()
    page.get_by_label("One answer per line").fill("12 1\nseven wrong")
    page.get_by_role("button", name="Replace the history").click()
    expect(page.locator("#kt-error")).to_contain_text('Line 2 ("seven wrong")')
    page.get_by_label("One answer per line").fill("12 1\n99999 0")
    page.get_by_role("button", name="Replace the history").click()
    page.get_by_role("button", name="Trace").click()
    expect(page.locator("#kt-error")).to_contain_text("422")
    expect(page.locator("#kt-error")).to_contain_text("interactions.1.question")
    watched.assert_clean(expected_statuses=(422, 422))


def test_the_page_and_its_files_come_from_the_server_with_a_strict_content_security_policy(server: str):
    page = httpx.get(f"{server}/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "script-src 'self'" in policy
    for path in ("/explorer/explorer.css", "/explorer/js/main.js", "/explorer/favicon.svg"):
        assert httpx.get(f"{server}{path}", timeout=10).status_code == 200
    for path in ("/explorer/../main.py", "/explorer/router.py", "/explorer/js/missing.js"):
        answer = httpx.get(f"{server}{path}", timeout=10)
        assert answer.status_code == 404, path


def test_every_static_file_ships_in_the_package():
    """pyproject's package-data globs cover every file of app/explorer/static (a wheel or `pip install .` has them)."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["app.explorer"]
    package = STATIC_DIR.parent
    files = [path.relative_to(package).as_posix() for path in STATIC_DIR.rglob("*") if path.is_file()]
    covered = [name for name in files if any(fnmatch(name, g) and name.count("/") == g.count("/") for g in globs)]
    assert files and covered == files
