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
    (artifacts_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return entry
