"""Soft targets for distilling several SICK pair models (teachers) into one: their mean predictions.

    python -m models.teacher_targets --onnx artifacts/rmc-vlmp-sick.onnx --run RUN_DIR ... --out FILE.npz

Each teacher, an exported pair graph (`--onnx`, run on onnxruntime) or a training run's `best.pt` (`--run`,
PyTorch in eval mode), predicts every SICK pair as given (a, b), without dropout. `FILE.npz` holds, for the
training pairs in file order, the teachers' mean relatedness distribution (`relatedness` [N,5]) and mean
entailment probabilities (`entailment` [N,3]), plus the training file's sha256; `models.train_sim
--teacher-targets FILE.npz` mixes them into its targets. `FILE.json` records each teacher's and the mean's
metrics on trial (and on test, for the record: nothing here chooses anything).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from app.tasks.similarity.vectors import WordVectors, special_vectors
from models.rmc import RMCConfig, SentencePairModel
from models.sick_data import SPLIT_FILES, read_split
from models.train_sim import TEACHER_PARTS, EncodedSplit, log_probabilities, split_metrics
from models.training import data_dir_default, data_file_records, load_checkpoint, set_threads, write_json

Predictions = dict[str, np.ndarray]  # "relatedness" [N,5] and "entailment" [N,3] probabilities


def onnx_predictions(path: Path, split: EncodedSplit, batch: int = 128) -> Predictions:
    """Probabilities from an exported pair graph (its outputs are log-probabilities and logits)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    relatedness, entailment = [], []
    for start in range(0, len(split), batch):
        emb_a, len_a, emb_b, len_b = (t.numpy() for t in split.batch(range(start, min(start + batch, len(split)))))
        feeds = {"emb_a": emb_a, "len_a": len_a, "emb_b": emb_b, "len_b": len_b}
        log_probs, logits = session.run(["relatedness_log_probs", "entailment_logits"], feeds)
        relatedness.append(np.exp(log_probs))
        entailment.append(torch.softmax(torch.from_numpy(logits), dim=-1).numpy())
    return {"relatedness": np.concatenate(relatedness), "entailment": np.concatenate(entailment)}


def run_predictions(run: Path, split: EncodedSplit, specials: np.ndarray, batch: int = 128) -> Predictions:
    """Probabilities from a training run's best weights, in eval mode (no dropout)."""
    checkpoint = load_checkpoint(run / "best.pt")
    if not np.array_equal(np.asarray(checkpoint["specials"], dtype=np.float32), specials):
        raise SystemExit(f"{run} was trained with other special-token vectors than --specials-seed")
    model = SentencePairModel(RMCConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    return {part: np.exp(values) for part, values in log_probabilities(model, split, batch).items()}


def mean_predictions(teachers: list[Predictions]) -> Predictions:
    """The teachers' mean probabilities (what an ensemble graph of them outputs)."""
    return {part: np.mean([t[part] for t in teachers], axis=0) for part in TEACHER_PARTS}


def prediction_metrics(predictions: Predictions, split: EncodedSplit) -> dict[str, float]:
    """Pearson r, Spearman rho, MSE of the expected relatedness; accuracy of the most probable label."""
    score = (predictions["relatedness"] * np.arange(1, 6)).sum(-1)
    return split_metrics(score, predictions["entailment"].argmax(-1), split)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", type=Path, action="append", default=[], help="an exported pair graph (teacher)")
    parser.add_argument("--run", type=Path, action="append", default=[], help="a training run's best.pt (teacher)")
    parser.add_argument("--out", type=Path, required=True, help="the .npz to write (metrics go to the .json beside)")
    parser.add_argument("--data-dir", type=Path, default=data_dir_default() / "sick")
    parser.add_argument("--specials-seed", type=int, default=1234, help="the teachers' special-token vectors")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if not args.onnx and not args.run:
        raise SystemExit("give at least one teacher (--onnx or --run)")
    set_threads(1)
    specials = special_vectors(args.specials_seed)
    vectors = WordVectors.from_glove(specials)
    files = {name: args.data_dir / filename for name, filename in SPLIT_FILES.items()}
    splits = {name: EncodedSplit(read_split(path), vectors) for name, path in files.items()}
    teachers: dict[str, dict[str, Predictions]] = {}
    for path in args.onnx:
        teachers[str(path)] = {name: onnx_predictions(path, split) for name, split in splits.items()}
    for run in args.run:
        teachers[str(run)] = {name: run_predictions(run, split, specials) for name, split in splits.items()}
    mean = {name: mean_predictions([t[name] for t in teachers.values()]) for name in splits}
    metrics = {
        "teachers": {
            teacher: {name: prediction_metrics(found[name], splits[name]) for name in ("trial", "test")}
            for teacher, found in teachers.items()
        },
        "mean": {name: prediction_metrics(mean[name], splits[name]) for name in ("trial", "test")},
    }
    records = data_file_records(files)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        args.out,
        relatedness=mean["train"]["relatedness"].astype(np.float32),
        entailment=mean["train"]["entailment"].astype(np.float32),
        train_sha256=np.array(records["train"]["sha256"]),
    )
    write_json(args.out.with_suffix(".json"), {"data_files": records, "specials_seed": args.specials_seed, **metrics})
    for teacher, found in [*metrics["teachers"].items(), ("mean of the teachers", metrics["mean"])]:
        trial = found["trial"]
        print(
            f"{teacher}: trial r {trial['pearson']:.4f} mse {trial['mse']:.4f} acc {trial['accuracy']:.4f} "
            f"(r + acc {trial['pearson'] + trial['accuracy']:.4f})"
        )
    return metrics


if __name__ == "__main__":
    main()
