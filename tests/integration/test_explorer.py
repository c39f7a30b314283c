"""The explorer page (GET /) in a real Chromium, against the real server serving the committed models.

Debian's `chromium` drives the page through Playwright (its own browser download is not possible here).
Without chromium (or MNEMO_CHROMIUM, the path of another build) the browser tests skip, except in CI
(CI=true), where that is a failure. Screenshots go to tmp/artifacts/explorer/ (or MNEMO_TEST_ARTIFACTS_DIR).
The servers keep their students in an SQLite file of the test's own temporary directory.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from app.explorer.router import STATIC_DIR
from tests.helpers import Server, children, running_server
from tests.integration.test_drain import HOLDING, _draining, _hold_one_request, _open_connections

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

ROOT = Path(__file__).resolve().parents[2]
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


API_KEY = "explorer-test-key-5d1f0a"


@contextmanager
def serving_process(state_dir: Path, **env: str) -> Iterator[Server]:
    """`python -m app` on a free port serving artifacts/ (students in `state_dir`), once /ready answers 200."""
    state = f"sqlite://{state_dir / 'students.db'}"
    with running_server(ROOT / "artifacts", ready_timeout_s=STARTUP_SECONDS, MNEMO_STATE_URL=state, **env) as live:
        yield live


@contextmanager
def serving(state_dir: Path, **env: str) -> Iterator[str]:
    """The URL of `serving_process`."""
    with serving_process(state_dir, **env) as live:
        yield live.url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("explorer-state")) as url:
        yield url


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

    def open(self, fragment: str = "", ready: bool = True) -> Page:
        self.page.goto(f"{self.origin}/{fragment}")
        if ready:
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


@contextmanager
def watching(browser: Browser, origin: str) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield Watched(context.new_page(), origin)
    finally:
        context.close()


@pytest.fixture
def watched(browser: Browser, server: str) -> Iterator[Watched]:
    with watching(browser, server) as page:
        yield page


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


def _paste_history(page: Page, lines: str) -> None:
    page.get_by_text("Paste a history").click()
    page.get_by_label("One answer per line").fill(lines)
    page.get_by_role("button", name="Replace the history").click()


def test_concept_columns_and_next_questions_carry_the_apis_concept_labels(watched: Watched, server: str):
    catalog = httpx.get(f"{server}/models/{KT_MODEL}/questions", params={"limit": 1}, timeout=10).json()
    labels = {item["concept"]: item["label"] for item in catalog["concepts"]}
    expected = [f"{concept} · {labels[concept]}" for concept in range(len(labels))]
    page = watched.open("#knowledge")
    page.locator("#kt-model").select_option(KT_MODEL)
    _paste_history(page, "1 1\n2 0\n3 1")
    page.get_by_role("button", name="Trace").click()
    expect(page.locator("#mastery-map rect.cell")).to_have_count(4 * len(labels))
    full_labels = (
        "ts => ts.map(t => (t.querySelector('title') ?? t).textContent)"  # a cut label keeps it whole as a tooltip
    )
    for figure in ("#mastery-map", "#kt-attention-map"):
        column_labels = page.locator(f"{figure} svg.heatmap text.label").evaluate_all(full_labels)[-len(labels) :]
        assert column_labels == expected
    page.locator("#mastery-map svg.heatmap").focus()
    page.keyboard.press("ArrowRight")
    expect(page.locator("#mastery-map .readout")).to_contain_text(f"concept 1 ({labels[1]}): mastery")
    first = page.locator("#next-table tbody tr").first.locator("td").nth(2)
    assert first.get_attribute("title") in expected
    watched.assert_clean()


def test_a_second_model_traces_the_same_history_side_by_side(watched: Watched, server: str):
    """Switching the model keeps the history (same data set); "Compare with" runs it through a second model too."""
    steps = "12 1\n7 0\n12 1\n30 1\n7 0"
    interactions = [{"question": int(q), "correct": c == "1"} for q, c in (line.split() for line in steps.split("\n"))]
    answers = {
        name: httpx.post(
            f"{server}/knowledge-trace", json={"model": name, "interactions": interactions}, timeout=30
        ).json()
        for name in (KT_MODEL, DKT_MODEL)
    }
    page = watched.open("#knowledge")
    page.locator("#kt-model").select_option(KT_MODEL)
    _paste_history(page, steps)
    page.locator("#kt-model").select_option(DKT_MODEL)
    expect(page.locator("#kt-model-about")).to_contain_text("DKT")
    page.locator("#kt-model").select_option(KT_MODEL)
    expect(page.locator("#history li")).to_have_count(5)  # the history survived both switches
    expect(page.locator("#history-note")).to_be_hidden()
    page.get_by_label("Compare with").select_option(DKT_MODEL)
    expect(page.locator("#kt-compare-about")).to_contain_text(f"Compared with {DKT_MODEL}: DKT")
    page.get_by_role("button", name="Trace").click()
    expect(page.locator("#kt-result")).to_be_visible()

    values = "ps => ps.map(p => Number(p.dataset.value))"
    assert page.locator("#prediction-chart circle.point").evaluate_all(values) == answers[KT_MODEL]["predictions"]
    assert (
        page.locator("#prediction-chart rect.compare-point").evaluate_all(values) == answers[DKT_MODEL]["predictions"]
    )
    expect(page.locator("#prediction-chart .legend")).to_contain_text(f"{KT_MODEL}{DKT_MODEL}")
    heads = page.locator("#next-table thead th").all_inner_texts()
    assert heads[-2:] == [f"P(right), {KT_MODEL}", f"P(right), {DKT_MODEL}"]
    first_row = page.locator("#next-table tbody tr").first.locator("td")
    question = int(first_row.nth(1).inner_text().split(" · ")[0])
    dkt_p = next(item["p_correct"] for item in answers[DKT_MODEL]["next"] if item["question"] == question)
    assert first_row.nth(4).inner_text().strip() == f"{dkt_p:.3f}"
    expect(page.locator("#mastery-map")).to_be_visible()  # the first model's concept maps stay
    watched.screenshot("compare-1280")

    page.locator("#kt-model").select_option("dkvmn-statics")  # another data set: its question ids mean others
    expect(page.locator("#history li")).to_have_count(0)
    expect(page.locator("#history-note")).to_contain_text("History cleared: dkvmn-statics is trained on statics")
    expect(page.get_by_label("Compare with")).to_be_disabled()
    watched.assert_clean()


def test_the_two_attention_maps_of_one_answer_share_one_colour_scale(watched: Watched, server: str):
    pair = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."}
    api = httpx.post(f"{server}/similarity", json={**pair, "return_attention": True}, timeout=30).json()
    largest = {key: max(max(row) for row in api["attention"][f"sentence_{key}"]) for key in ("a", "b")}
    assert f"{largest['a']:.2f}" != f"{largest['b']:.2f}"  # else this pair could not tell one scale from two
    page = watched.open()
    page.get_by_role("button", name="Compare").click()
    expect(page.locator("#similarity-result")).to_be_visible()
    top = max(largest.values())
    for key in ("a", "b"):
        assert page.locator(f"#attention-{key} .legend > span").all_inner_texts()[:2] == ["0.00", f"{top:.2f}"]
    fill = "(cells, value) => cells.find(c => Number(c.dataset.value) === value).getAttribute('fill')"
    lower = min(largest, key=largest.get)
    viridis_top = "rgb(253, 231, 37)"
    assert page.locator(f"#attention-{lower} rect.cell").evaluate_all(fill, largest[lower]) != viridis_top
    higher = max(largest, key=largest.get)
    assert page.locator(f"#attention-{higher} rect.cell").evaluate_all(fill, largest[higher]) == viridis_top
    watched.assert_clean()


def _contrast(foreground: str, background: str) -> float:
    """WCAG 2 contrast ratio of two opaque CSS rgb() colours."""

    def luminance(colour: str) -> float:
        channels = [int(part) / 255 for part in re.findall(r"\d+", colour)[:3]]
        linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_a_hovered_tab_keeps_its_text_readable(watched: Watched, server: str):
    page = watched.open()
    for name in ("Similarity", "Knowledge tracing"):  # the active tab, then the other one
        tab = page.get_by_role("tab", name=name)
        tab.hover()
        colours = tab.evaluate("t => { const s = getComputedStyle(t); return [s.color, s.backgroundColor]; }")
        assert not colours[1].startswith("rgba"), colours  # opaque, so the ratio below is the one on screen
        assert _contrast(*colours) >= 4.5, (name, colours)
    watched.assert_clean()


def test_each_model_is_described_in_one_line_with_a_link_to_the_api_docs(watched: Watched, server: str):
    models = {model["name"]: model for model in httpx.get(f"{server}/models", timeout=10).json()["models"]}
    page = watched.open()
    similarity = next(model for model in models.values() if model["task"] == "similarity" and model["default"])
    about = page.locator("#similarity-model-about")
    expect(about).to_contain_text(
        f"trained on SICK for relatedness (1..5) and entailment: test Pearson r "
        f"{similarity['metrics']['test_pearson']:.3f}"
    )
    page.get_by_role("tab", name="Knowledge tracing").click()
    for name, family in ((KT_MODEL, "DKVMN, a key-value memory network"), (DKT_MODEL, "DKT, the LSTM baseline")):
        page.locator("#kt-model").select_option(name)
        expect(page.locator("#kt-model-about")).to_contain_text(family)
        text = page.locator("#kt-model-about").inner_text()
        assert text.startswith(family) and text.endswith(
            f"trained on ASSISTments 2009 (maths): test AUC {models[name]['metrics']['test_auc']:.3f}."
        )
    links = page.locator("#panel-knowledge a[href='docs']")
    expect(links).to_have_count(1)
    links.click()
    expect(page.locator(".opblock").first).to_be_visible(timeout=30_000)  # Swagger UI, from this server
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


def test_a_dkt_student_is_appended_to_once_and_shown_without_concept_maps(watched: Watched, server: str):
    """DKT's student answers have no mastery: the append is shown, not reported as failed (which invited a retry
    that stored the answers twice)."""
    student_id = f"dkt-learner-{time.monotonic_ns()}"
    page = watched.open("#knowledge")
    page.locator("#kt-model").select_option(DKT_MODEL)
    expect(page.locator("#kt-model-info")).to_contain_text("no latent concepts")
    page.get_by_label("Student id").fill(student_id)
    page.get_by_text("Paste a history").click()
    page.get_by_label("One answer per line").fill("12 1\n7 0\n12 1")
    page.get_by_role("button", name="Replace the history").click()
    page.get_by_role("button", name="Append to student").click()
    expect(page.locator("#student-summary")).to_have_text(
        f"Student “{student_id}” under {DKT_MODEL}: 3 answers stored (3 just added)."
    )
    expect(page.locator("#kt-error")).to_be_hidden()
    expect(page.locator("#history li")).to_have_count(0)
    expect(page.locator("#append-student")).to_be_disabled()
    expect(page.locator("#prediction-chart circle.point")).to_have_count(3)
    expect(page.locator("#mastery-map")).to_be_hidden()
    expect(page.locator("#kt-attention-map")).to_be_hidden()
    stored = httpx.get(f"{server}/students/{student_id}", params={"model": DKT_MODEL}, timeout=10).json()
    assert stored["interactions"] == 3
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


def _catalog_steps(server: str, headers: dict[str, str] | None = None) -> list[tuple[dict, bool]]:
    """A 5-step history over three named questions of KT_MODEL, as (catalog item, answered right)."""
    params = {"limit": 1000}
    catalog = httpx.get(f"{server}/models/{KT_MODEL}/questions", params=params, headers=headers, timeout=10).json()
    chosen = [item for item in catalog["questions"] if item["name"]][:3]
    return [(chosen[0], True), (chosen[1], False), (chosen[0], True), (chosen[2], True), (chosen[1], False)]


def _paste(page: Page, steps: list[tuple[dict, bool]]) -> None:
    page.get_by_text("Paste a history").click()
    page.get_by_label("One answer per line").fill("\n".join(f"{item['question']} {int(c)}" for item, c in steps))
    page.get_by_role("button", name="Replace the history").click()
    expect(page.locator("#history li")).to_have_count(len(steps))


def _values(locator) -> list[float]:
    return [float(value) for value in locator.evaluate_all("xs => xs.map(x => x.dataset.value)")]


def test_a_student_is_created_appended_to_and_read_back_from_the_server(watched: Watched, server: str):
    steps = _catalog_steps(server)
    interactions = [{"question": item["question"], "correct": correct} for item, correct in steps]
    stateless = httpx.post(
        f"{server}/knowledge-trace", json={"model": KT_MODEL, "interactions": interactions}, timeout=30
    ).json()
    student_id = f"learner-{time.monotonic_ns()}"
    page = watched.open("#knowledge")
    page.locator("#kt-model").select_option(KT_MODEL)
    student = page.get_by_label("Student id")

    student.fill(student_id)
    page.get_by_role("button", name="Load student").click()  # not created yet: a 404, said in words
    expect(page.locator("#kt-error")).to_contain_text(f"No student “{student_id}” under {KT_MODEL} yet (404)")

    _paste(page, steps)
    page.get_by_role("button", name="Append to student").click()
    expect(page.locator("#student-summary")).to_have_text(
        f"Student “{student_id}” under {KT_MODEL}: 5 answers stored (5 just added)."
    )
    expect(page.locator("#kt-error")).to_be_hidden()
    expect(page.locator("#history li")).to_have_count(0)  # stored now, so not sent twice
    points = page.locator("#prediction-chart circle.point")
    expect(points).to_have_count(5)
    assert _values(points) == pytest.approx(stateless["predictions"], abs=1e-6)  # a new student: same as stateless
    n_concepts = stateless["n_concepts"]
    expect(page.locator("#mastery-map g.row")).to_have_count(6)
    expect(page.locator("#mastery-map rect.cell")).to_have_count(6 * n_concepts)
    assert _values(page.locator("#mastery-map rect.cell")) == pytest.approx(
        [value for row in stateless["mastery"] for value in row], abs=1e-6
    )
    expect(page.locator("#kt-attention-map g.row")).to_have_count(5)
    expect(page.locator("#next-table tbody tr")).to_have_count(15)
    last_row = _values(page.locator("#mastery-map g.row[data-row='5'] rect.cell"))
    watched.screenshot("student-1280")
    page.set_viewport_size({"width": 375, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    watched.screenshot("student-375")
    page.set_viewport_size({"width": 1280, "height": 900})

    page.reload()  # nothing of the student stays in the page: it comes back from the server
    expect(page.locator("body[data-ready=true]")).to_have_count(1, timeout=30_000)
    page.locator("#kt-model").select_option(KT_MODEL)
    student.fill(student_id)
    student.press("Enter")  # Enter in the id field loads
    expect(page.locator("#student-summary")).to_contain_text(f"Student “{student_id}” under {KT_MODEL}: 5 answers")
    stored = httpx.get(f"{server}/students/{student_id}", params={"model": KT_MODEL}, timeout=10).json()
    expect(page.locator("#mastery-map g.row")).to_have_count(1)
    expect(page.locator("#prediction-chart")).to_be_hidden()
    assert _values(page.locator("#mastery-map rect.cell")) == stored["mastery"]
    assert stored["mastery"] == pytest.approx(last_row, abs=1e-6)
    page.get_by_text("Mastery per concept, stored for this student: the numbers").click()
    table_values = page.locator("#mastery-map details tbody td")
    expect(table_values).to_have_text([f"{value:.3f}" for value in last_row])  # the same numbers as after the append

    question = page.get_by_label("Question (type a name or an id)")  # two more answers, by keyboard
    question.fill(str(steps[3][0]["question"]))
    question.press("Enter")
    question.fill(str(steps[1][0]["question"]))
    page.get_by_role("button", name="Add: wrong ✗").click()
    page.get_by_role("button", name="Append to student").click()
    expect(page.locator("#student-summary")).to_contain_text("7 answers stored (2 just added)")
    expect(page.locator("#prediction-chart circle.point")).to_have_count(2)
    expect(page.locator("#mastery-map g.row")).to_have_count(3)
    expect(page.locator("#mastery-map text.label").first).to_have_text("stored (5)")
    assert _values(page.locator("#mastery-map g.row[data-row='0'] rect.cell")) == pytest.approx(last_row, abs=1e-6)
    assert page.locator("#prediction-chart svg text.label").all_text_contents()[5:7] == ["6", "7"]

    student.fill("two words")  # an invalid id: the API's rule, shown before anything is sent
    page.get_by_role("button", name="Load student").click()
    expect(page.locator("#kt-error")).to_have_text(
        "Student id: student_id must contain only printable characters other than whitespace; character 3 is U+0020."
    )
    watched.assert_clean(expected_statuses=(404,))


STUDENT_IDS = [
    "learner-42",
    "学生-7",
    "emoji-😀",
    "😀" * 128,  # 128 code points (256 UTF-16 units): the API counts code points
    "😀" * 129,
    "x" * 128,
    "x" * 129,
    "two words",
    "tab\there",
    "nbsp\u00a0id",
    "zero\u200bwidth",
    "line\u2028break",
    "bell\x07",
    "%41?#",
    "..x",
]


def test_the_page_checks_student_ids_as_the_api_does(watched: Watched, server: str):
    page = watched.open()
    check = "async ids => { const m = await import('/explorer/js/students.js'); return ids.map(m.studentIdProblem); }"
    in_page = page.evaluate(check, STUDENT_IDS)
    for student_id, problem in zip(STUDENT_IDS, in_page, strict=True):
        answer = httpx.get(f"{server}/students/{quote(student_id, safe='')}", timeout=10)
        if problem is None:
            assert answer.status_code == 404, (student_id, answer.text)  # valid, and no such student
        else:
            assert answer.status_code == 422, (student_id, answer.text)
            assert answer.json()["detail"][0]["msg"].endswith(problem), (student_id, problem)
    assert [problem is None for problem in in_page][:4] == [True] * 4
    # the API's router never sees these ("/" splits the path, "." and ".." are path steps), so the page refuses them
    assert page.evaluate(check, ["", "a/b", ".", ".."]) == [
        "student_id must be 1 to 128 characters long; it has 0",
        "student_id must not contain '/' (it is one URL path segment); character 1",
        "student_id must not be '.' or '..' (URL path segments)",
        "student_id must not be '.' or '..' (URL path segments)",
    ]
    watched.assert_clean()


def test_with_api_keys_the_page_asks_for_the_key_and_keeps_it_in_memory_only(browser: Browser, tmp_path: Path) -> None:
    with serving(tmp_path, MNEMO_API_KEYS=API_KEY) as origin, watching(browser, origin) as watched:
        bearer = {"Authorization": f"Bearer {API_KEY}"}
        pair = {"sentence_a": "A dog runs in the park.", "sentence_b": "A dog is running outside."}
        api = httpx.post(f"{origin}/similarity", json=pair, headers=bearer, timeout=30).json()
        steps = _catalog_steps(origin, bearer)
        page = watched.open(ready=False)
        status = page.locator("#status")
        expect(status).to_contain_text("Could not list the models: 401: A valid API key is required")
        expect(status).to_contain_text("Type this server's API key in the “API key” field at the top.")
        watched.screenshot("api-key-missing")

        key = page.get_by_label("API key")
        key.fill("not-the-key")
        key.press("Enter")
        expect(status).to_contain_text("401")
        # The key typed, then edited again before the models came (a slow server): the page is set up once
        # (it was set up twice, and then every button sent its request twice).
        script = """key => { const field = document.getElementById("api-key");
          for (const value of [key + " ", key]) { field.value = value; field.dispatchEvent(new Event("change")); } }"""
        page.evaluate(script, API_KEY)
        expect(page.locator("body[data-ready=true]")).to_have_count(1, timeout=30_000)

        page.get_by_label("Sentence A").fill(pair["sentence_a"])
        page.get_by_label("Sentence B").fill(pair["sentence_b"])
        page.get_by_role("button", name="Compare").click()
        expect(page.get_by_test_id("relatedness")).to_have_text(f"{api['relatedness']:.3f}")
        page.wait_for_timeout(500)
        assert [url for url in watched.requests if url.endswith("/similarity")] == [f"{origin}/similarity"]

        page.get_by_role("tab", name="Knowledge tracing").click()
        page.locator("#kt-model").select_option(KT_MODEL)
        _paste(page, steps)
        page.get_by_role("button", name="Trace").click()
        expect(page.locator("#prediction-chart circle.point")).to_have_count(5)
        page.get_by_label("Student id").fill("keyed-learner")
        page.get_by_role("button", name="Append to student").click()
        expect(page.locator("#student-summary")).to_contain_text("5 answers stored (5 just added)")
        expect(page.locator("#mastery-map g.row")).to_have_count(6)
        watched.screenshot("api-key-given")

        stored = page.evaluate(
            """async () => ({local: localStorage.length, session: sessionStorage.length, cookie: document.cookie,
                 databases: (await indexedDB.databases()).length, html: document.documentElement.outerHTML})"""
        )
        assert stored["local"] == 0 and stored["session"] == 0 and stored["cookie"] == ""
        assert stored["databases"] == 0 and API_KEY not in stored["html"]
        assert page.context.cookies() == []
        assert all(API_KEY not in url for url in [*watched.requests, page.url])

        page.reload()  # memory only: a new page has no key
        expect(page.get_by_label("API key")).to_have_value("")
        expect(status).to_contain_text("401")
        watched.assert_clean(expected_statuses=(401, 401, 401))


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


def test_the_page_is_also_at_explorer_slash_and_addresses_the_server_by_relative_urls(server: str):
    """Relative URLs keep the page working behind a proxy's path prefix (a root_path): none starts with '/'."""
    for path in ("/explorer/", "/explorer/index.html"):  # served there, its relative URLs would miss by a level
        moved = httpx.get(f"{server}{path}", timeout=10)
        assert moved.status_code == 307 and moved.headers["location"] == "../"
        assert httpx.get(f"{server}{path}", follow_redirects=True, timeout=10).text == httpx.get(f"{server}/").text
    for path in STATIC_DIR.rglob("*.*"):
        assert not re.findall(r"""(?:href|src)="/|["'`]/[a-z]""", path.read_text()), path


def test_a_file_the_browser_has_is_answered_304_without_a_body(server: str):
    for path in ("/", "/explorer/js/main.js"):
        first = httpx.get(f"{server}{path}", timeout=10)
        etag = first.headers["etag"]
        assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
        for if_none_match in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            again = httpx.get(f"{server}{path}", headers={"If-None-Match": if_none_match}, timeout=10)
            assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag), if_none_match
        changed = httpx.get(f"{server}{path}", headers={"If-None-Match": '"other"'}, timeout=10)
        assert changed.status_code == 200 and changed.content == first.content


def test_every_static_file_ships_in_the_package():
    """pyproject's package-data globs cover every file of app/explorer/static (a wheel or `pip install .` has them)."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["app.explorer"]
    package = STATIC_DIR.parent
    files = [path.relative_to(package).as_posix() for path in STATIC_DIR.rglob("*") if path.is_file()]
    covered = [name for name in files if any(fnmatch(name, g) and name.count("/") == g.count("/") for g in globs)]
    assert files and covered == files


@pytest.mark.parametrize(("path", "rendered"), [("/docs", ".opblock"), ("/redoc", "[data-section-id]")])
def test_the_docs_pages_load_nothing_from_elsewhere_and_no_site_can_frame_them(
    watched: Watched, server: str, path: str, rendered: str
) -> None:
    """ReDoc's bundle asks cdn.redoc.ly for its logo: the page's policy refuses it before it leaves the browser."""
    answer = httpx.get(f"{server}{path}", timeout=10)
    policy = answer.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy and "img-src 'self' data:" in policy
    page = watched.page
    refused_urls: list[str] = []  # Chromium names them as requests, but they never leave it
    page.on("requestfailed", lambda request: request.failure == "csp" and refused_urls.append(request.url))
    page.goto(f"{server}{path}")
    expect(page.locator(rendered).first).to_be_visible(timeout=30_000)  # the page's own inline script ran
    page.wait_for_timeout(1_000)  # ReDoc asks for its logo after the first render
    foreign = [url for url in watched.requests if not url.startswith((server + "/", "blob:", "data:"))]
    assert [url for url in foreign if url not in refused_urls] == []
    refused = [text for text in watched.console_errors if "Content Security Policy" in text]
    assert [text for text in watched.console_errors if text not in refused] == []
    assert all("cdn.redoc.ly" in text for text in refused), refused


def _paste_many(page: Page, count: int, seed: int = 1) -> list[dict]:
    """`count` random answers over KT_MODEL's 110 questions, put in the paste box and loaded as the history."""
    rng = random.Random(seed)
    interactions = [{"question": rng.randint(1, 110), "correct": bool(rng.randint(0, 1))} for _ in range(count)]
    text = "\n".join(f"{item['question']} {int(item['correct'])}" for item in interactions)
    page.evaluate("t => { paste.open = true; document.getElementById('paste-text').value = t; }", text)
    page.get_by_role("button", name="Replace the history").click()
    expect(page.locator("#history-count")).to_have_text(f"{count} answers", timeout=30_000)
    return interactions


def test_a_5000_step_history_is_drawn_on_a_canvas_that_reads_by_keyboard(watched: Watched, server: str):
    """5,000 steps x 20 concepts were 200,000 SVG cells (the tab froze while they were built); now a canvas."""
    page = watched.open("#knowledge")
    page.locator("#kt-model").select_option(KT_MODEL)
    interactions = _paste_many(page, 5000)
    with page.expect_response("**/knowledge-trace", timeout=120_000) as answer:
        page.get_by_role("button", name="Trace").click()
    expect(page.locator("#kt-attention-map .legend")).to_have_count(1, timeout=60_000)
    api = answer.value.json()
    assert page.locator("#kt-result rect.cell").count() == 0
    mastery = page.locator("#mastery-map canvas.heatmap")
    expect(mastery).to_have_attribute("aria-label", re.compile(r"5001 by 20 map"))
    expect(page.locator("#mastery-map")).to_contain_text("too many cells to draw one by one")
    mastery.focus()  # the values by keyboard, as on a small map
    for key in ("End", "ArrowRight", "ArrowRight"):
        page.keyboard.press(key)
    last = interactions[-1]
    catalog = httpx.get(f"{server}/models/{KT_MODEL}/questions", params={"limit": 1}, timeout=10).json()
    concept = re.escape(f"concept 2 ({catalog['concepts'][2]['label']})")
    expect(page.locator("#mastery-map .readout")).to_have_text(
        re.compile(rf"^after step 5000 · {last['question']} · .*, {concept}: mastery {api['mastery'][5000][2]:.3f}$")
    )
    watched.screenshot("knowledge-5000-1280")
    watched.assert_clean()


def test_a_hung_server_is_said_and_given_up_after_the_timeout(browser: Browser, tmp_path: Path):
    """fetch had no timeout: with no answer the page said nothing and its buttons stayed disabled for ever.

    A server of the test's own hangs for real (SIGSTOP once the page is loaded: the request reaches its socket and
    is never answered); the page's clock skips the 30 s. One worker: the process stopped is the one serving
    (gunicorn's master, which only watches it, would replace it after MNEMO_WORKER_STALL_S).
    """
    with serving_process(tmp_path, MNEMO_WORKERS="1") as live, watching(browser, live.url) as watched:
        page = watched.page
        page.clock.install()
        page = watched.open("#knowledge")
        page.locator("#kt-model").select_option(KT_MODEL)
        _paste_many(page, 3)
        [worker] = children(live.process.pid)
        os.kill(worker, signal.SIGSTOP)
        try:
            page.get_by_role("button", name="Trace").click()
            expect(page.locator("#kt-busy")).to_have_text("Tracing: waiting for the server (at most 30 s)…")
            page.clock.fast_forward(31_000)
            expect(page.locator("#kt-error")).to_have_text("The server did not answer within 30 s.")
            expect(page.locator("#kt-busy")).to_be_hidden()
            expect(page.get_by_role("button", name="Trace")).to_be_enabled()
            assert Path(f"/proc/{worker}/stat").read_text().split(") ")[1][0] == "T"  # still stopped
        finally:
            os.kill(worker, signal.SIGCONT)
        assert [url for url in watched.requests if url.endswith("/knowledge-trace")] == [f"{live.url}/knowledge-trace"]
        watched.assert_clean()


def test_a_slow_trace_answer_never_replaces_a_later_append(watched: Watched, server: str):
    """Trace and Append could run at once and whichever answered last was drawn: a slow trace overwrote the append."""
    student_id = f"raced-{time.monotonic_ns()}"
    stored = [{"question": 12, "correct": True}] * 5
    body = {"model": KT_MODEL, "interactions": stored}
    assert httpx.post(f"{server}/students/{student_id}/interactions", json=body, timeout=30).status_code == 200
    page = watched.page
    held: list = []
    page.route("**/knowledge-trace", lambda route: held.append(route))
    page = watched.open("#knowledge")
    page.locator("#kt-model").select_option(KT_MODEL)
    _paste_many(page, 3)
    page.get_by_role("button", name="Trace").click()
    while not held:  # the trace is on its way
        page.wait_for_timeout(50)
    page.get_by_label("Student id").fill(student_id)
    page.get_by_role("button", name="Append to student").click()  # the later request, answered first
    expect(page.locator("#student-summary")).to_contain_text("8 answers stored (3 just added)")
    with page.expect_response("**/knowledge-trace") as late:
        held[0].continue_()  # now the real server answers the earlier trace
    assert late.value.status == 200
    page.wait_for_timeout(300)
    expect(page.locator("#student-summary")).to_contain_text("8 answers stored (3 just added)")
    assert page.locator("#prediction-chart svg text.label").all_text_contents()[5:8] == ["6", "7", "8"]
    expect(page.locator("#kt-busy")).to_be_hidden()
    watched.assert_clean()


def test_a_503_from_a_draining_server_says_when_to_try_again(browser: Browser, tmp_path: Path):
    """429 and 503 showed the API's message but not its Retry-After.

    A server of the test's own drains (SIGTERM while one request is held in flight) and answers the page's Compare
    with its real 503 and Retry-After.
    """
    env = {"MNEMO_WORKERS": "1", "MNEMO_DRAIN_S": "60", "MNEMO_KEEP_ALIVE_S": "1", **HOLDING}
    with serving_process(tmp_path, **env) as live, watching(browser, live.url) as watched:
        page = watched.open()
        page.get_by_label("Sentence A").fill("A dog runs in the park.")
        page.get_by_label("Sentence B").fill("A dog is running outside.")
        held = _hold_one_request(live)  # keeps the server draining until it is finished
        live.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while not _draining(live):
            assert time.monotonic() < deadline, live.output[-5:]
            time.sleep(0.02)
        # the draining server still serves the connections open before the signal: the page's idle ones time out
        while _open_connections(live.url) > 1:  # the held request's
            assert time.monotonic() < deadline, "the page's kept-alive connections stayed open"
            time.sleep(0.05)
        with page.expect_response("**/similarity") as answer:
            page.get_by_role("button", name="Compare").click()
        refused = answer.value
        retry_after = refused.headers["retry-after"]
        assert refused.status == 503 and retry_after.isdigit()
        expect(page.locator("#similarity-error")).to_have_text(
            f"503: {refused.json()['detail']} Try again in {retry_after} s."
        )
        expect(page.locator("#similarity-busy")).to_be_hidden()
        watched.assert_clean(expected_statuses=(503,))
        assert held.finish()[0] == 200  # the admitted request is answered, then the server exits
        assert live.process.wait(timeout=30) == 0
