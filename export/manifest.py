"""Read and update artifacts/manifest.json, the list of served models with their sha256."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.core.integrity import sha256_of

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1


def load_manifest(artifacts_dir: Path) -> dict[str, Any]:
    """The manifest as a dict; an absent file is an empty manifest."""
    path = artifacts_dir / MANIFEST_NAME
    if not path.exists():
        return {"schema_version": SCHEMA_VERSION, "models": []}
    return json.loads(path.read_text())


def upsert_model(artifacts_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Insert or replace the entry named `entry["name"]`, filling in sha256 of its file, assets and graphs."""
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    entry = dict(entry)
    entry["sha256"] = sha256_of(artifacts_dir / entry["file"])
    for asset in [*entry.get("assets", {}).values(), *entry.get("graphs", {}).values()]:
        asset["sha256"] = sha256_of(artifacts_dir / asset["file"])
    if not (artifacts_dir / MANIFEST_NAME).exists():
        print(f"note: {artifacts_dir} had no {MANIFEST_NAME}: starting a new one, which serves only this model")
    manifest = load_manifest(artifacts_dir)
    models = [m for m in manifest["models"] if m["name"] != entry["name"]]
    models.append(entry)
    manifest["models"] = sorted(models, key=lambda m: (m["task"], m["name"]))
    from models.training import write_json  # here: `mnemo train --help` reads MANIFEST_NAME without importing torch

    write_json(artifacts_dir / MANIFEST_NAME, manifest)  # whole or not at all: a full disk keeps the old one
    return entry


def semantic_version(text: str) -> tuple[int, int, int]:
    """`MAJOR.MINOR.PATCH` as numbers (ValueError otherwise)."""
    parts = text.split(".")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        raise ValueError(f"version {text!r} is not MAJOR.MINOR.PATCH")
    major, minor, patch = (int(part) for part in parts)
    return major, minor, patch


def file_digests(entry: dict[str, Any]) -> dict[str, str]:
    """The sha256 of every file an entry serves: its graph, its assets and its other graphs."""
    digests = {"file": entry["sha256"]}
    for kind in ("assets", "graphs"):
        digests |= {f"{kind}.{key}": item["sha256"] for key, item in entry.get(kind, {}).items()}
    return digests


def unversioned_changes(previous: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Entries of `current` whose files changed since `previous` without a higher version (docs/MODELS.md §5:
    new bytes need a new version, new weights a new minor or major), one line each."""
    before = {entry["name"]: entry for entry in previous["models"]}
    problems = []
    for entry in current["models"]:
        old = before.get(entry["name"])
        if old is None or file_digests(old) == file_digests(entry):
            continue
        changed = sorted(key for key, digest in file_digests(entry).items() if file_digests(old).get(key) != digest)
        if semantic_version(entry["version"]) <= semantic_version(old["version"]):
            problems.append(
                f"{entry['name']}: {', '.join(changed)} changed but the version went from {old['version']} to "
                f"{entry['version']}; give it a higher one"
            )
    return problems
