"""The served recipes: the exact commands that built each model in artifacts/, as data.

`export.reproduce` runs a model's commands into a scratch directory; each card's "Reproduce" section quotes
them (tests/training/test_model_cards.py checks the quote); `make train-kt` and `make train-sim` take their default
arguments from here (docs/MODELS.md §5):

    python -m models.recipes train-kt synthetic-v3      # the served recipe's models.train_kt arguments
    python -m models.recipes train-sim vlmp --seed 102   # one member of the served VLMP ensemble

Placeholders in the arguments: `{data}` the data folder (`kt/` and `sick/` inside), `{runs}` the scratch
directory of the training runs, `{artifacts}` where the export writes. Seeds are spelled out even where they
are the default, so a changed default cannot change a recipe. No torch import: the Makefile calls this.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

TRAINING_FLAGS = ("--threads", "1", "--resume", "--no-progress")  # how every served run was started


@dataclass(frozen=True)
class Command:
    """One `python -m <module> <args>` step of a recipe."""

    module: str
    args: tuple[str, ...]

    def argv(self, **places: str) -> list[str]:
        """The arguments with the placeholders filled in."""
        return [arg.format(**places) for arg in self.args]

    def text(self, **places: str) -> str:
        """The command line as a card quotes it."""
        return shlex.join(["python", "-m", self.module, *self.argv(**places)])


@dataclass(frozen=True)
class Recipe:
    """The commands that rebuild one served model: the training runs, then the export of their result."""

    train: tuple[Command, ...]
    export: Command
    card_minutes: float  # the training wall time the card records (1 CPU thread), to plan a rerun


def _train_kt(dataset: str, out: str, *recipe: str) -> Command:
    place = ("--data-dir", "{data}/kt", "--out", f"{{runs}}/{out}")
    return Command("models.train_kt", ("--dataset", dataset, *recipe, "--seed", "1024", *place, *TRAINING_FLAGS))


def _export(module: str, run: str, name: str, *flags: str) -> Command:
    return Command(module, ("--run", run, "--name", name, "--artifacts", "{artifacts}", *flags))


# The served recipes of the similarity members: pointer -> ((seed, --max-minutes budget), ...). No member reached
# its budget (each stopped by patience or at the epoch limit), so the budget does not change the weights.
SIM_MEMBERS = {
    "vlmp": ((101, 22), (102, 22), (103, 22), (104, 35), (105, 35)),
    "flmp": ((101, 35), (102, 35), (103, 35)),
}
SIM_RECIPE = (
    "--fc-dim", "128", "--heads", "4", "--head-size", "32", "--epochs", "30", "--patience", "6",
    "--specials-seed", "1234", "--swap-relatedness", "0", "--average-from", "6",
)  # fmt: skip


def sim_member_arguments(pointer: str, seed: int, minutes: int) -> tuple[str, ...]:
    """models.train_sim arguments of one served ensemble member (without --data-dir and --out)."""
    return ("--pointer", pointer, *SIM_RECIPE, "--max-minutes", str(minutes), "--seed", str(seed))


def _sim_member_run(pointer: str, seed: int) -> str:
    return f"{pointer}-m128-fc128-s{seed}-swa6"


def _sim_recipe(pointer: str, name: str, card_minutes: float, *flags: str) -> Recipe:
    members = SIM_MEMBERS[pointer]
    train = tuple(
        Command(
            "models.train_sim",
            (
                *sim_member_arguments(pointer, seed, minutes),
                *("--data-dir", "{data}/sick", "--out", f"{{runs}}/{_sim_member_run(pointer, seed)}"),
                *TRAINING_FLAGS,
            ),
        )
        for seed, minutes in members
    )
    runs = [arg for seed, _ in members for arg in ("--run", f"{{runs}}/{_sim_member_run(pointer, seed)}")]
    export = Command(
        "export.similarity_ensemble",
        (*runs, "--name", name, "--artifacts", "{artifacts}", "--data-dir", "{data}/sick", *flags),
    )
    return Recipe(train, export, card_minutes)


# The grid of docs/protocols/rmc-vlmp-msrp.md: (dropout, learning rate) of each validation-only run.
PARAPHRASE_GRID = (("0.25", "1e-3"), ("0.25", "1e-4"), ("0.5", "1e-3"), ("0.5", "1e-4"))


def _paraphrase_recipe(name: str, card_minutes: float) -> Recipe:
    """The MSRP head's four runs on the served rmc-vlmp-sick encoder (read from artifacts/), then the export
    that chooses one on validation and evaluates MSRP test once."""
    runs = [f"{{runs}}/d{dropout}-lr{lr}" for dropout, lr in PARAPHRASE_GRID]
    train = tuple(
        Command(
            "models.train_paraphrase",
            (
                *("--encoder-model", "rmc-vlmp-sick", "--artifacts", "artifacts", "--data-dir", "{data}/msrp"),
                *("--out", run, "--dropout", dropout, "--lr", lr, "--seed", "1234", "--split-seed", "1234"),
                *("--threads", "1", "--resume"),
            ),
        )
        for run, (dropout, lr) in zip(runs, PARAPHRASE_GRID, strict=True)
    )
    export = Command(
        "export.paraphrase",
        (
            *(arg for run in runs for arg in ("--run", run)),
            *("--name", name, "--artifacts", "{artifacts}", "--encoder-artifacts", "artifacts"),
            *("--data-dir", "{data}/msrp"),
        ),
    )
    return Recipe(train, export, card_minutes)


# Per served model. The KT recipes are models.train_kt's defaults of the data set plus the arguments shown.
SERVED: dict[str, Recipe] = {
    "dkvmn-synthetic": Recipe(
        (_train_kt("synthetic-v0", "synthetic-v0", "--optimizer", "sgd", "--epochs", "100", "--refit-full"),),
        _export("export.kt", "{runs}/synthetic-v0", "dkvmn-synthetic"),
        card_minutes=4.4,
    ),
    "dkvmn-assist2009": Recipe(
        (_train_kt("assist2009", "assist2009", "--refit-full"),),
        _export("export.kt", "{runs}/assist2009", "dkvmn-assist2009", "--default"),
        card_minutes=17.2,
    ),
    "dkvmn-assist2015": Recipe(
        (_train_kt("assist2015", "assist2015"),),
        _export("export.kt", "{runs}/assist2015", "dkvmn-assist2015"),
        card_minutes=21.5,
    ),
    "dkvmn-statics": Recipe(
        (
            Command(
                "models.cv_kt",
                (
                    *("--out", "{runs}/statics-n10-cv", "--refit", "--"),
                    *("--dataset", "statics", "--memory-size", "10", "--seed", "1024", "--data-dir", "{data}/kt"),
                    *("--threads", "1", "--no-progress"),
                ),
            ),
        ),
        _export("export.kt", "{runs}/statics-n10-cv/fold3", "dkvmn-statics"),
        card_minutes=35.0,
    ),
    "dkt-assist2009": Recipe(
        (
            _train_kt(
                "assist2009", "dkt-assist2009", *("--model", "dkt", "--hidden", "200", "--lr", "1e-3"), "--refit-full"
            ),
        ),
        _export("export.dkt", "{runs}/dkt-assist2009", "dkt-assist2009"),
        card_minutes=36.8,
    ),
    "rmc-vlmp-sick": _sim_recipe("vlmp", "rmc-vlmp-sick", 74.2, "--default"),
    "rmc-flmp-sick": _sim_recipe("flmp", "rmc-flmp-sick", 50.8),
    "rmc-vlmp-msrp": _paraphrase_recipe("rmc-vlmp-msrp", 21.6),
}

# `make train-kt DATASET=...`: the served recipe of each data set (synthetic-vK: any version).
KT_DATASET_MODEL = {"assist2009": "dkvmn-assist2009", "assist2015": "dkvmn-assist2015", "synthetic": "dkvmn-synthetic"}
# dkvmn-statics was chosen by cross-validation (`make reproduce MODEL=dkvmn-statics` reruns it); its refit replays
# fold 3, the fold with the median best epoch, so one models.train_kt run rebuilds it without the other folds.
STATICS_SHORTCUT = ("--memory-size", "10", "--fold", "3", "--refit-full", "--seed", "1024")


def train_kt_arguments(dataset: str) -> tuple[str, ...]:
    """models.train_kt arguments of the served recipe for a data set (without --dataset, --data-dir, --out)."""
    if dataset == "statics":
        return STATICS_SHORTCUT
    family = "synthetic" if dataset.startswith("synthetic-v") else dataset
    if family not in KT_DATASET_MODEL:
        raise SystemExit(f"no served recipe for data set {dataset!r}: {', '.join([*KT_DATASET_MODEL, 'statics'])}")
    args = SERVED[KT_DATASET_MODEL[family]].train[0].args
    start, end = args.index("--dataset") + 2, args.index("--data-dir")
    return args[start:end]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    kt = commands.add_parser("train-kt", help="models.train_kt arguments of a data set's served recipe")
    kt.add_argument("dataset")
    sim = commands.add_parser("train-sim", help="models.train_sim arguments of one served ensemble member")
    sim.add_argument("pointer", choices=sorted(SIM_MEMBERS))
    sim.add_argument("--seed", type=int, default=101)
    args = parser.parse_args(argv)
    if args.command == "train-kt":
        print(shlex.join(train_kt_arguments(args.dataset)))
        return
    budgets = dict(SIM_MEMBERS[args.pointer])
    if args.seed not in budgets:
        parser.error(f"the served {args.pointer} members have seeds {', '.join(map(str, budgets))}")
    print(shlex.join(sim_member_arguments(args.pointer, args.seed, budgets[args.seed])))


if __name__ == "__main__":
    main()
