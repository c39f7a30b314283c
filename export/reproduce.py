"""Rebuild a served model from the data in a scratch directory, then set its metrics beside the card's.

    python -m export.reproduce dkvmn-synthetic        # or: make reproduce MODEL=dkvmn-synthetic

Runs the model's served recipe (`models/recipes.py`), each step as its own `python -m` process: the training
runs under `<out>/runs`, the export under `<out>/artifacts` (default out: `runs/reproduce/<model>`). The
served artifacts/ is only read, never written. The steps resume (`--resume`), so an interrupted reproduction
continues where it stopped. At the end every metric of the new manifest entry is printed next to the served
entry's, and whether the ONNX bytes, the weights and the assets are the same. `--print` only prints the
commands; `--card` rewrites the generated block of the served card's Reproduce section (after a version bump).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from models.recipes import SERVED, Command

DEFAULT_DATA = "../shared/data"
BEGIN, END = "<!-- reproduce -->", "<!-- /reproduce -->"


def places(name: str, out: Path | None = None, data: str = DEFAULT_DATA) -> dict[str, str]:
    """The placeholder values of a model's commands (the card quotes the defaults)."""
    out = out or Path("runs/reproduce") / name
    return {"data": data, "runs": f"{out}/runs", "artifacts": f"{out}/artifacts"}


def commands(name: str, version: str) -> list[Command]:
    """The model's training commands, then its export with the served version."""
    recipe = SERVED[name]
    export = Command(recipe.export.module, (*recipe.export.args, "--version", version))
    return [*recipe.train, export]


def card_section(name: str, version: str) -> list[str]:
    """The generated part of a card's Reproduce section: the make target and the commands it runs."""
    recipe = SERVED[name]
    lines = [
        BEGIN,
        f"`make reproduce MODEL={name}` (or `python -m export.reproduce {name}`) runs these commands from the "
        f"repository root, into `runs/reproduce/{name}/` (training runs, then the export into its own `artifacts/`; "
        "the served `artifacts/` is only read), then prints each new metric next to this card's and whether the ONNX "
        "bytes, the weights and the assets are the same. "
        f"The card records {recipe.card_minutes:g} min of training at 1 CPU thread. "
        "Data: `../shared/data`, or `DATA_DIR=...` for make, `--data-dir` for python.",
        "",
        "```sh",
        *(command.text(**places(name)) for command in commands(name, version)),
        "```",
        END,
    ]
    return lines


def run_step(step: Command, where: dict[str, str]) -> None:
    """One command of the recipe, in its own process, announced first."""
    print(f"==> {step.text(**where)}", flush=True)
    subprocess.run([sys.executable, "-m", step.module, *step.argv(**where)], check=True)


def check_refit(export: Command, train: list[Command], where: dict[str, str]) -> None:
    """Stop before exporting a run that lacks the refit its recipe asks for: a cross-validation that picked
    another median fold than the served one holds the refit in that fold's directory."""
    if not any(flag in step.args for step in train for flag in ("--refit", "--refit-full")):
        return
    argv = export.argv(**where)
    run = Path(argv[argv.index("--run") + 1])
    if not json.loads((run / "result.json").read_text()).get("refit"):
        runs = run.parent.glob("*/result.json")
        found = sorted(str(path.parent) for path in runs if json.loads(path.read_text()).get("refit"))
        raise SystemExit(f"{run} holds no refit (the refit is in {', '.join(found) or 'no run'}): export that run")


def splice(card: str, lines: list[str]) -> str:
    """The card with its generated Reproduce block replaced by `lines`."""
    if BEGIN not in card or END not in card:
        raise SystemExit(f"the card has no {BEGIN} ... {END} block in its Reproduce section")
    head, rest = card.split(BEGIN, 1)
    return head + "\n".join(lines) + rest.split(END, 1)[1]


def compare(served: dict, new: dict, served_dir: Path, new_dir: Path) -> list[str]:
    """A table of every metric of the two manifest entries, then whether the graphs' bytes, their weights and
    the assets match."""
    keys = [*served["metrics"], *(k for k in new["metrics"] if k not in served["metrics"])]
    rows = [f"{'metric':<40} {'card':>10} {'reproduced':>11} {'difference':>11}"]
    for key in keys:
        old, fresh = served["metrics"].get(key), new["metrics"].get(key)
        numbers = isinstance(old, int | float) and isinstance(fresh, int | float)
        difference = _cell(fresh - old, signed=True) if numbers else "-"
        rows.append(f"{key:<40} {_cell(old):>10} {_cell(fresh):>11} {difference:>11}")
    same = "the same" if served["sha256"] == new["sha256"] else "different"
    rows.append(f"ONNX bytes: {same} (sha256 {served['sha256'][:12]} served, {new['sha256'][:12]} reproduced)")
    gap = weights_difference(served_dir / served["file"], new_dir / new["file"])
    rows.append(
        "ONNX weights: not comparable (different tensors)"
        if gap is None
        else f"ONNX weights: {'identical' if gap == 0 else f'largest absolute difference {gap:.3g}'}"
    )
    for key, asset in served.get("assets", {}).items():
        fresh = new.get("assets", {}).get(key)
        verdict = "missing" if fresh is None else "the same" if fresh["sha256"] == asset["sha256"] else "different"
        rows.append(f"asset {key} ({asset['file']}): {verdict} bytes")
    return rows


def weights_difference(served: Path, new: Path) -> float | None:
    """Largest absolute difference between the graphs' initializers matched by name (None: other tensors)."""

    def initializers(path: Path) -> dict:
        return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}

    old, fresh = initializers(served), initializers(new)
    if old.keys() != fresh.keys() or any(old[k].shape != fresh[k].shape for k in old):
        return None
    gaps = [float(np.max(np.abs(old[k].astype(np.float64) - fresh[k]))) for k in old if old[k].size]
    return max(gaps, default=0.0)


def _cell(value, signed: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:+.4f}" if signed else f"{value:.4f}"
    return f"{value:+d}" if signed else str(value)


def entry(artifacts: Path, name: str) -> dict:
    """The manifest entry of `name` in an artifacts directory."""
    manifest = json.loads((artifacts / "manifest.json").read_text())
    return next(model for model in manifest["models"] if model["name"] == name)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=sorted(SERVED))
    parser.add_argument("--out", type=Path, default=None, help="scratch directory (default runs/reproduce/<model>)")
    parser.add_argument("--data-dir", default=os.environ.get("MNEMO_DATA_DIR", DEFAULT_DATA))
    parser.add_argument("--served", type=Path, default=Path("artifacts"), help="the served artifacts (read only)")
    parser.add_argument("--print", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--card", action="store_true", help="rewrite the served card's Reproduce block, run nothing")
    args = parser.parse_args(argv)
    served = entry(args.served, args.model)
    where = places(args.model, args.out, args.data_dir)
    if Path(where["artifacts"]).resolve() == args.served.resolve():
        parser.error("--out would export into the served artifacts; choose a scratch directory")
    steps = commands(args.model, served["version"])
    if args.card:
        card = args.served / served["card"]
        card.write_text(splice(card.read_text(), card_section(args.model, served["version"])))
        print(f"{card}: Reproduce block of {args.model} {served['version']}")
        return []
    if args.print:
        print("\n".join(step.text(**where) for step in steps))
        return []
    *train, export = steps
    for step in train:
        run_step(step, where)
    check_refit(export, train, where)
    run_step(export, where)
    scratch = Path(where["artifacts"])
    table = compare(served, entry(scratch, args.model), args.served, scratch)
    print(f"\n{args.model} {served['version']}: the card's metrics (artifacts/manifest.json) and this rebuild's")
    print("\n".join(table))
    return table


if __name__ == "__main__":
    main()
