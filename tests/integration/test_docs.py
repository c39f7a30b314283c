"""The docs stay true: the README's and docs/' console examples answer as shown on a live server, the generated
configuration page matches the settings, and every relative link points to a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts import config_docs
from tests.conftest import COMMITTED
from tests.doc_examples import examples, parsed, run, shape
from tests.helpers import ROOT, running_server

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WITH_EXAMPLES = [page for page in PAGES if examples(page)]
LINK = re.compile(r"\]\(([^)#\s]*)(#[^)]*)?\)")


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_the_readme_and_the_api_page_have_examples():
    assert {ROOT / "README.md", ROOT / "docs" / "api.md"} <= set(WITH_EXAMPLES)


@pytest.mark.parametrize("page", WITH_EXAMPLES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_console_example_answers_in_the_shape_shown(page: Path, tmp_path: Path):
    """Each command runs in order on a fresh server (its own student store); what it prints has the keys, list
    lengths and types the docs show (numbers may differ), and a line of plain text reads exactly as shown."""
    state = f"sqlite://{tmp_path / 'students.db'}"
    with running_server(COMMITTED, MNEMO_STATE_URL=state) as server:
        for example in examples(page):
            printed = run(example, server.url, tmp_path)
            shown, got = [shape(value) for value in parsed(example.output)], [shape(v) for v in parsed(printed)]
            assert got == shown, f"{page.name} line {example.line}: {example.command}\nprinted: {printed}"


def test_the_shape_comparison_catches_a_missing_key_and_a_changed_type():
    assert shape({"a": [1, 2.5], "b": "x"}) == shape({"a": [3, 4], "b": "y"})
    assert shape({"a": [1, 2]}) != shape({"a": [1]})
    assert shape({"a": 1}) != shape({"a": "1"})
    assert shape({"a": 1}) != shape({"a": 1, "b": None})
    assert [shape(v) for v in parsed("rmc 768")] != [shape(v) for v in parsed("rmc 767")]


def test_the_configuration_page_is_generated_from_the_settings():
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == config_docs.render(), "docs/configuration.md is stale: run `make docs`"


def anchors(page: Path) -> set[str]:
    """The anchors of a markdown page's headings, as GitHub makes them."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_and_heading(page: Path):
    for target, anchor in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        linked = page.parent / target if target else page
        assert linked.exists(), f"{page.name}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor[1:] in anchors(linked), f"{page.name}: {target}{anchor}"
