"""A served model's version changes with its bytes: the committed manifest against the previous commit's.

`/v2/models/{name}/versions/{version}`, `GET /models` and `mnemo_model_info{version}` tell weights apart only if
every new graph or asset comes with a higher version (docs/MODELS.md §5). CI runs on a clone with history; a
checkout without git or without a previous commit skips the history check.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from export.manifest import semantic_version, unversioned_changes

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "artifacts" / "manifest.json"


def committed_manifest(revision: str) -> dict | None:
    """artifacts/manifest.json as of a git revision; None when git, the revision or the file is missing."""
    if shutil.which("git") is None:
        return None
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:artifacts/manifest.json"],
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(shown.stdout) if shown.returncode == 0 else None


@pytest.mark.parametrize("revision", ["HEAD~1", "HEAD"])
def test_changed_files_come_with_a_higher_version(revision):
    previous = committed_manifest(revision)
    if previous is None:
        pytest.skip(f"no git history with {revision}:artifacts/manifest.json (not a git checkout, or shallow)")
    assert unversioned_changes(previous, json.loads(MANIFEST.read_text())) == []


def test_every_version_is_major_minor_patch():
    for entry in json.loads(MANIFEST.read_text())["models"]:
        assert semantic_version(entry["version"]) >= (1, 0, 0), entry["name"]


def test_a_new_graph_or_asset_under_the_same_version_is_reported():
    previous = json.loads(MANIFEST.read_text())
    current = copy.deepcopy(previous)
    kt = next(entry for entry in current["models"] if "init_memory" in entry["assets"])
    kt["assets"]["init_memory"]["sha256"] = "0" * 64
    (problem,) = unversioned_changes(previous, current)
    assert problem.startswith(f"{kt['name']}: assets.init_memory changed but the version went from")
    kt["version"] = "0.9.0"  # lower is no better
    assert len(unversioned_changes(previous, current)) == 1
    major, minor, _ = semantic_version(previous["models"][current["models"].index(kt)]["version"])
    kt["version"] = f"{major}.{minor + 1}.0"
    assert unversioned_changes(previous, current) == []


def test_a_version_that_is_not_major_minor_patch_is_refused():
    for text in ("1.0", "v1.0.0", "1.0.0-rc1", "1..0"):
        with pytest.raises(ValueError, match=r"MAJOR\.MINOR\.PATCH"):
            semantic_version(text)
