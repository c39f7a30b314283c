"""Train the LSTM_RMC pair model on SICK: relatedness and entailment heads on one encoder.

    python -m models.train_sim --pointer vlmp --data-dir ../shared/data/sick

Frozen GloVe 6B 50d vectors (looked up with the serving code's tokenizer and vectors), Adam with a
one-epoch linear warmup and x0.99 decay per epoch, gradient-norm clip 5, length-sorted batches.
Validates on SICK trial every epoch and keeps the epoch with the best trial Pearson r + accuracy (with
`--average-from K`, also the mean of the weights of epochs K.. at each epoch end, whichever scores best);
stops early; evaluates the test split once at the end. With `--teacher-targets FILE` (written by
`models.teacher_targets`) and `--distill-weight w`, the targets of every training pair are mixed with the
teachers' mean predictions (knowledge distillation, Hinton et al. 2015): (1 - w) * gold + w * teacher;
`--teacher-temperature T` first softens the teachers' entailment probabilities to p^(1/T), renormalised.
Writes `last.pt`, `best.pt` and `result.json` into `--out` (default runs/sim/<pointer>).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import pearsonr, spearmanr
from tqdm import tqdm

from app.core.integrity import sha256_of
from app.tasks.similarity.tokenizer import tokenize
from app.tasks.similarity.vectors import WordVectors, special_vectors
from models.cli import (
    add_run_options,
    parse_training_arguments,
    positive_float,
    positive_int,
    probability,
    run_directory,
)
from models.epoch_loop import StoppingRule, TrainingTask, run_epochs
from models.rmc import RMCConfig, SentencePairModel
from models.sick_data import SPLIT_FILES, SickPair, read_split, relatedness_target
from models.training import (
    command_line,
    data_dir_default,
    data_file_records,
    load_checkpoint,
    seed_everything,
    set_threads,
    write_json,
)


class EncodedSplit:
    """A SICK split as word-vector arrays plus targets."""

    def __init__(self, pairs: list[SickPair], vectors: WordVectors) -> None:
        self.a = [vectors.embed(tokenize(p.sentence_a))[0] for p in pairs]
        self.b = [vectors.embed(tokenize(p.sentence_b))[0] for p in pairs]
        self.scores = np.array([p.relatedness for p in pairs], dtype=np.float32)
        self.targets = np.stack([relatedness_target(p.relatedness) for p in pairs])
        self.labels = np.array([p.entailment for p in pairs], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, rows, swapped: np.ndarray | None = None) -> tuple[torch.Tensor, ...]:
        """Padded tensors (a and b padded to one common length) for the given rows; where `swapped` is
        true, sentence b is fed as a and a as b."""
        swapped = np.zeros(len(rows), dtype=bool) if swapped is None else swapped
        firsts = [self.b[i] if swap else self.a[i] for i, swap in zip(rows, swapped, strict=True)]
        seconds = [self.a[i] if swap else self.b[i] for i, swap in zip(rows, swapped, strict=True)]
        length = max(max(len(a), len(b)) for a, b in zip(firsts, seconds, strict=True))
        emb_a = np.zeros((len(rows), length, self.a[0].shape[1]), dtype=np.float32)
        emb_b = np.zeros_like(emb_a)
        for slot, (a, b) in enumerate(zip(firsts, seconds, strict=True)):
            emb_a[slot, : len(a)] = a
            emb_b[slot, : len(b)] = b
        len_a = torch.tensor([len(a) for a in firsts])
        len_b = torch.tensor([len(b) for b in seconds])
        return torch.from_numpy(emb_a), len_a, torch.from_numpy(emb_b), len_b

    def length_sorted_batches(self, size: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Batches of similar length (random tie-breaking), in random order; every pair kept."""
        lengths = np.array([max(len(a), len(b)) for a, b in zip(self.a, self.b, strict=True)])
        order = np.lexsort((rng.random(len(lengths)), lengths))
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        rng.shuffle(batches)
        return batches


def distillation_targets(
    targets: torch.Tensor, labels: torch.Tensor, teacher: tuple[torch.Tensor, torch.Tensor], weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 - w) * gold + w * teacher for the relatedness distribution [B,5] and the entailment label (one-hot)
    [B,3], given the teachers' mean relatedness distribution and entailment probabilities."""
    teacher_relatedness, teacher_entailment = teacher
    one_hot = F.one_hot(labels, teacher_entailment.shape[-1]).to(teacher_entailment.dtype)
    return (1 - weight) * targets + weight * teacher_relatedness, (1 - weight) * one_hot + weight * teacher_entailment


def joint_loss(
    outputs,
    targets: torch.Tensor,
    labels: torch.Tensor,
    swapped: torch.Tensor,
    teacher: tuple[torch.Tensor, torch.Tensor] | None = None,
    distill_weight: float = 0.0,
) -> torch.Tensor:
    """KL(target || predicted) per pair averaged over the batch (relatedness) + cross-entropy (entailment)
    averaged over the pairs fed in their own order: relatedness is symmetric, entailment is not (a entailing
    b says nothing of b entailing a), so a swapped pair teaches relatedness only. With `teacher` and a weight
    w > 0, both targets are mixed with the teacher's (`distillation_targets`; soft cross-entropy)."""
    log_probs, _, entailment_logits = outputs[:3]
    if teacher is None or distill_weight == 0:
        entailment = F.cross_entropy(entailment_logits, labels, reduction="none")
    else:
        targets, soft_labels = distillation_targets(targets, labels, teacher, distill_weight)
        entailment = -(soft_labels * F.log_softmax(entailment_logits, dim=-1)).sum(-1)
    kept = (~swapped).to(entailment.dtype)
    return F.kl_div(log_probs, targets, reduction="batchmean") + (entailment * kept).sum() / kept.sum().clamp(min=1)


@torch.no_grad()
def evaluate(model: SentencePairModel, split: EncodedSplit, batch: int = 128) -> dict[str, float]:
    """Pearson r, Spearman rho and MSE of the relatedness score; entailment accuracy."""
    model.eval()
    scores, predicted = [], []
    for start in range(0, len(split), batch):
        outputs = model(*split.batch(range(start, min(start + batch, len(split)))))
        scores.append(outputs[1].numpy())
        predicted.append(outputs[2].argmax(-1).numpy())
    return split_metrics(np.concatenate(scores), np.concatenate(predicted), split)


@torch.no_grad()
def log_probabilities(model: SentencePairModel, split: EncodedSplit, batch: int = 128) -> dict[str, np.ndarray]:
    """The model's relatedness and entailment log-probabilities for every pair of the split."""
    model.eval()
    relatedness, entailment = [], []
    for start in range(0, len(split), batch):
        outputs = model(*split.batch(range(start, min(start + batch, len(split)))))
        relatedness.append(outputs[0].numpy())
        entailment.append(torch.log_softmax(outputs[2], dim=-1).numpy())
    return {"relatedness": np.concatenate(relatedness), "entailment": np.concatenate(entailment)}


def split_metrics(score: np.ndarray, label: np.ndarray, split: EncodedSplit) -> dict[str, float]:
    """Pearson r, Spearman rho and MSE of predicted relatedness scores, accuracy of predicted labels."""
    score = score.astype(np.float64)
    return {
        "pearson": float(pearsonr(score, split.scores)[0]),
        "spearman": float(spearmanr(score, split.scores)[0]),
        "mse": float(np.mean((score - split.scores) ** 2)),
        "accuracy": float(np.mean(label == split.labels)),
    }


def train_epoch(
    model, optimizer, schedule, split: EncodedSplit, rng: np.random.Generator, args, teacher: dict | None = None
) -> float:
    """One pass over length-sorted batches in random order; returns the mean loss per pair. `teacher`: the
    teachers' "relatedness" and "entailment" probabilities of every training pair (distillation)."""
    model.train()
    total = 0.0
    batches = split.length_sorted_batches(args.batch, rng)
    for rows in tqdm(batches, desc="train", leave=False, disable=args.no_progress):
        swapped = (
            rng.random(len(rows)) < args.swap_relatedness if args.swap_relatedness else np.zeros(len(rows), dtype=bool)
        )
        loss = joint_loss(
            model(*split.batch(rows, swapped)),
            torch.from_numpy(split.targets[rows]),
            torch.from_numpy(split.labels[rows]),
            torch.from_numpy(swapped),
            None if teacher is None else tuple(torch.from_numpy(teacher[part][rows]) for part in TEACHER_PARTS),
            args.distill_weight,
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        schedule.step()
        total += loss.item() * len(rows)
    return total / len(split)


TEACHER_PARTS = ("relatedness", "entailment")


def soften(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """Probabilities at temperature T (Hinton et al. 2015): softmax(log p / T), i.e. p^(1/T) renormalised per row."""
    if temperature == 1:
        return probabilities
    logits = np.log(np.clip(probabilities, 1e-12, None)) / temperature
    exponentials = np.exp(logits - logits.max(-1, keepdims=True))
    return (exponentials / exponentials.sum(-1, keepdims=True)).astype(probabilities.dtype)


def read_teacher_targets(path: Path, train: dict[str, str], pairs: int) -> dict[str, np.ndarray]:
    """The teachers' probabilities for the training pairs, checked against the training file and its size."""
    stored = np.load(path)
    if str(stored["train_sha256"]) != train["sha256"]:
        raise SystemExit(f"{path} was computed on another training file than {train['file']}")
    teacher = {part: stored[part].astype(np.float32) for part in TEACHER_PARTS}
    if [len(teacher[part]) for part in TEACHER_PARTS] != [pairs, pairs]:
        raise SystemExit(f"{path} does not hold one row per training pair ({pairs})")
    return teacher


def restore_schedule_and_shuffling(checkpoint: dict, schedule, rng: np.random.Generator) -> None:
    """Put the learning-rate schedule and the batch-order generator back where `last.pt` left them."""
    schedule.load_state_dict(checkpoint["schedule"])
    rng.bit_generator.state = checkpoint["rng"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pointer", choices=("vlmp", "flmp"), default="vlmp")
    parser.add_argument("--window", type=positive_int, default=5, help="VLMP window w")
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--head-size", type=positive_int, default=32, help="memory width M = heads * head size")
    parser.add_argument("--fc-dim", type=positive_int, default=512, help="width of the pair classifier layers")
    parser.add_argument("--dropout-relatedness", type=probability, default=0.4, help="dropout in the relatedness head")
    parser.add_argument("--dropout-entailment", type=probability, default=0.25, help="dropout in the entailment head")
    parser.add_argument("--data-dir", type=Path, default=data_dir_default() / "sick")
    parser.add_argument("--out", type=run_directory, default=None, help="run directory (default runs/sim/<pointer>)")
    parser.add_argument("--epochs", type=positive_int, default=40)
    parser.add_argument(
        "--patience", type=positive_int, default=8, help="epochs without a better trial score before stopping"
    )
    parser.add_argument("--max-minutes", type=positive_float, default=math.inf, help="stop starting epochs after this")
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--lr", type=positive_float, default=3e-4)
    parser.add_argument("--decay", type=positive_float, default=0.99, help="learning-rate factor per epoch")
    parser.add_argument("--clip", type=positive_float, default=5.0)
    parser.add_argument(
        "--swap-relatedness",
        type=float,
        default=0.0,
        help="probability that a training pair is fed as (b, a), then for its relatedness loss only",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--specials-seed",
        type=int,
        default=None,
        help="seed of the <s>, </s>, <number>, <unk> vectors (default --seed); ensemble members must share it",
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--average-from",
        type=int,
        default=0,
        help="from this epoch on, also validate the equal-weight mean of the weights at each epoch end and "
        "let selection pick it (stochastic weight averaging; 0: off)",
    )
    parser.add_argument(
        "--teacher-targets",
        type=Path,
        default=None,
        help="teachers' mean predictions on the training pairs (.npz of models.teacher_targets): distill them",
    )
    parser.add_argument(
        "--distill-weight",
        type=float,
        default=0.5,
        help="with --teacher-targets, the teachers' share w of the targets: (1 - w) * gold + w * teacher",
    )
    parser.add_argument(
        "--teacher-temperature",
        type=float,
        default=1.0,
        help="with --teacher-targets, soften the teachers' entailment probabilities to temperature T: "
        "p^(1/T), renormalised (their relatedness distributions are kept: softening would move the expected score)",
    )
    add_run_options(parser)
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_training_arguments(build_parser(), argv, lambda args: Path("runs/sim") / args.pointer)
    out = args.out
    set_threads(args.threads)
    seed_everything(args.seed)
    rng = np.random.default_rng(args.seed)
    files = {name: args.data_dir / filename for name, filename in SPLIT_FILES.items()}
    for path in files.values():
        if not path.exists():
            raise SystemExit(f"missing data file {path} (set --data-dir or MNEMO_DATA_DIR)")
    specials = special_vectors(args.seed if args.specials_seed is None else args.specials_seed)
    vectors = WordVectors.from_glove(specials)
    splits = {name: EncodedSplit(read_split(path), vectors) for name, path in files.items()}
    records = data_file_records(files)
    teacher = None
    if args.teacher_targets is not None:
        if not 0 <= args.distill_weight <= 1:
            raise SystemExit("--distill-weight must lie in [0, 1]")
        if args.teacher_temperature <= 0:
            raise SystemExit("--teacher-temperature must be positive")
        teacher = read_teacher_targets(args.teacher_targets, records["train"], len(splits["train"]))
        teacher["entailment"] = soften(teacher["entailment"], args.teacher_temperature)
    config = RMCConfig(
        pointer=args.pointer,
        window=args.window,
        num_heads=args.heads,
        head_size=args.head_size,
        fc_dim=args.fc_dim,
        dropout_relatedness=args.dropout_relatedness,
        dropout_entailment=args.dropout_entailment,
    )
    model = SentencePairModel(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps_per_epoch = math.ceil(len(splits["train"]) / args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / steps_per_epoch) * args.decay ** (step // steps_per_epoch),
    )
    print(
        f"{args.pointer}: {sum(p.numel() for p in model.parameters())} parameters, "
        f"{len(splits['train'])} train / {len(splits['trial'])} trial / {len(splits['test'])} test pairs"
    )
    task = TrainingTask(
        model=model,
        optimizer=optimizer,
        train_epoch=lambda: train_epoch(model, optimizer, schedule, splits["train"], rng, args, teacher),
        validate=lambda: evaluate(model, splits["trial"]),
        score=lambda metrics: metrics["pearson"] + metrics["accuracy"],
        split="trial",
        best_payload={"config": config.to_dict(), "specials": specials},
        save_extra=lambda: {"schedule": schedule.state_dict(), "rng": rng.bit_generator.state},
        load_extra=lambda checkpoint: restore_schedule_and_shuffling(checkpoint, schedule, rng),
        average_from=args.average_from,
    )
    rule = StoppingRule(epochs=args.epochs, patience=args.patience, max_minutes=args.max_minutes)
    state = run_epochs(task, out, rule, resume=args.resume)
    model.load_state_dict(load_checkpoint(out / "best.pt")["model"])
    result = {
        "pointer": args.pointer,
        "command": command_line("models.train_sim", argv),
        "seed": args.seed,
        "specials_seed": args.seed if args.specials_seed is None else args.specials_seed,
        "swap_relatedness": args.swap_relatedness,
        "config": config.to_dict(),
        "optimizer": (
            f"Adam lr {args.lr}, 1-epoch linear warmup, x{args.decay}/epoch, clip {args.clip}, batch {args.batch}"
        ),
        "data_files": records,
        **(
            {}
            if teacher is None
            else {
                "teacher_targets": {"file": str(args.teacher_targets), "sha256": sha256_of(args.teacher_targets)},
                "distill_weight": args.distill_weight,
                "teacher_temperature": args.teacher_temperature,
            }
        ),
        "epochs_run": state["epoch"],
        "best_epoch": state["best_epoch"],
        "average_from": args.average_from,
        "best_weights": state.get("best_weights", "raw"),  # "average": the mean of best_averaged_epochs
        "best_averaged_epochs": state.get("best_averaged_epochs"),
        "wall_seconds": round(state["wall_seconds"], 1),
        "threads": args.threads,
        "trial": evaluate(model, splits["trial"]),
        "test": evaluate(model, splits["test"]),
        "history": state["history"],
    }
    write_json(out / "result.json", result)
    print(
        f"best epoch {result['best_epoch']}: test r {result['test']['pearson']:.4f} mse {result['test']['mse']:.4f} "
        f"acc {result['test']['accuracy']:.4f}"
    )
    return result


if __name__ == "__main__":
    main()
