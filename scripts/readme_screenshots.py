"""The explorer screenshots (docs/explorer.md, README): tests/integration/test_explorer.py's 1280 px ones, 256 colours.

Run by `make screenshots` after the browser tests wrote their screenshots to ARTIFACTS (tmp/artifacts/explorer/).
Usage: python scripts/readme_screenshots.py ARTIFACTS DOCS
"""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image

# test screenshot -> the docs' file
SHOTS = {
    "similarity-1280.png": "explorer-similarity.png",
    "knowledge-1280.png": "explorer-knowledge.png",
    "student-1280.png": "explorer-student.png",
    "compare-1280.png": "explorer-compare.png",
}
COLOURS = 256


def reduce(source: Path, target: Path) -> None:
    """`source` as an 8-bit palette PNG of at most COLOURS colours (median cut, no dithering) at `target`."""
    with Image.open(source) as image:
        palette = image.convert("RGB").quantize(COLOURS, dither=Image.Dither.NONE)
    palette.save(target, optimize=True)


def main(artifacts: Path, docs: Path) -> None:
    missing = [name for name in SHOTS if not (artifacts / name).is_file()]
    if missing:
        sys.exit(
            f"no {', '.join(missing)} in {artifacts}: run tests/integration/test_explorer.py first (make screenshots)"
        )
    docs.mkdir(parents=True, exist_ok=True)
    for name, readme_name in SHOTS.items():
        reduce(artifacts / name, docs / readme_name)
        print(f"{docs / readme_name}: {(docs / readme_name).stat().st_size} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
