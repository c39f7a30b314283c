"""Sentence-encoder and pair-head ONNX graphs derived from a served LSTM_RMC pair graph, with their evaluation.

python -m export.embeddings --name rmc-vlmp-sick

The weights are read back from the committed pair graph `<name>.onnx` itself, so the two new graphs use
exactly the weights that /similarity serves (the training checkpoints need not exist any more):

- `<name>.encoder.onnx`: `emb` [B,T,50] float32, `len` [B] int64 -> `embedding` [B,2M], the sentence vector
  the heads read: the final memory of the forward pass, then the final memory of the backward pass.
- `<name>.head.onnx`: `embedding_a`, `embedding_b` [B,2M] -> `relatedness_log_probs` [B,5], `relatedness` [B],
  `entailment_logits` [B,3], the same outputs as the pair graph for the same pair.

Checks (the command fails past `PARITY_TOLERANCE`): the rebuilt PyTorch model against the pair graph, and
encoder + head graphs against the pair graph on every SICK trial pair. It then reports, on SICK trial and
test, the Pearson r with the gold relatedness of the cosine of the two sentence vectors and of the full
pair head, adds both graphs to the model's manifest entry (`graphs`) and an embeddings section to its card.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

from app.tasks.similarity.tokenizer import tokenize
from app.tasks.similarity.vectors import EMBEDDING_DIM, WordVectors
from export.manifest import load_manifest, upsert_model
from export.onnx_export import export_graph, export_scan_graph, graph_nodes
from models.rmc import RMCConfig, SentencePairModel
from models.sick_data import SPLIT_FILES, SickPair, read_split
from models.training import data_dir_default

PARITY_TOLERANCE = 1e-4
MAX_SENTENCES = 256  # sentences per POST /embeddings request
PAIR_OUTPUTS = ["relatedness_log_probs", "relatedness", "entailment_logits"]
EVALUATION_BATCH = 128
STATE_ROOTS = ("encoder", "relatedness_head", "entailment_head", "score_levels")  # SentencePairModel's own names
CARD_HEADING = "## Sentence embeddings"


class SentenceEncoder(torch.nn.Module):
    """The encoder of a pair model alone: word vectors of one sentence -> its sentence vector."""

    def __init__(self, model: SentencePairModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, emb: torch.Tensor, lengths: torch.Tensor, use_scan: bool = False) -> torch.Tensor:
        return self.model.sentence_vector(emb, lengths, use_scan)


class PairHead(torch.nn.Module):
    """The two heads of a pair model alone: two sentence vectors -> relatedness and entailment."""

    def __init__(self, model: SentencePairModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, embedding_a: torch.Tensor, embedding_b: torch.Tensor):
        return self.model.score_pair(embedding_a, embedding_b)


def model_from_pair_graph(path: Path, pointer: str, window: int, heads: int) -> SentencePairModel:
    """The PyTorch pair model rebuilt from the initializers of its exported ONNX graph (see `stored_weights`)."""
    weights = stored_weights(onnx.load(str(path)).graph)
    memory = weights["encoder.initial_memory"].shape[1]
    config = RMCConfig(
        pointer=pointer,
        window=window,
        embed_dim=EMBEDDING_DIM,
        num_heads=heads,
        head_size=memory // heads,
        mlp_layers=sum(1 for name in weights if re.fullmatch(r"encoder\.attention_mlp\.\d+\.weight", name)),
        fc_dim=weights["relatedness_head.1.weight"].shape[0],
    )
    model = SentencePairModel(config).eval()
    missing = set(model.state_dict()) - set(weights)
    if missing:  # the exporter merges initializers of equal values (untrained ones): their names are lost
        raise SystemExit(f"{path.name}: weights not found in the graph: {', '.join(sorted(missing))}")
    model.load_state_dict({name: torch.from_numpy(np.array(value)) for name, value in weights.items()})
    return model


def stored_weights(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The state dict held by an exported graph.

    Most weights keep their state-dict key as their name (prefixed `model.` when a wrapper was exported). The
    exporter stores the weights of some Linear layers transposed, as the unnamed second operand of a MatMul;
    such a weight is named after the bias that the Add right after that MatMul adds (`<layer>.bias` ->
    `<layer>.weight`, transposed back). `load_state_dict` then checks that every weight was found.
    """
    stored = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    weights = {state_key(name): value for name, value in stored.items() if state_key(name)}
    nodes = list(graph_nodes(graph))
    added = {}  # operand of an Add -> the other operands it is added to
    for node in nodes:
        if node.op_type == "Add":
            for operand, other in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
                added.setdefault(operand, []).append(other)
    for node in nodes:
        if node.op_type != "MatMul" or node.input[1] not in stored or state_key(node.input[1]):
            continue
        biases = [state_key(name) for name in added.get(node.output[0], []) if state_key(name).endswith(".bias")]
        if len(biases) != 1:
            raise SystemExit(f"cannot name the weight {node.input[1]} of MatMul {node.name}: no single bias after it")
        weights[biases[0].removesuffix(".bias") + ".weight"] = stored[node.input[1]].T
    return weights


def state_key(name: str) -> str:
    """The state-dict key of a graph initializer, or "" for a value the exporter made up (`val_46`)."""
    key = name.removeprefix("model.")
    return key if key.split(".")[0] in STATE_ROOTS else ""


def export_graphs(model: SentencePairModel, encoder_path: Path, head_path: Path) -> None:
    """The encoder graph (dynamic batch and length, time loop as one Scan) and the head graph (dynamic batch)."""
    batch, steps = torch.export.Dim("batch"), torch.export.Dim("time")
    example = (torch.randn(2, 7, model.config.embed_dim), torch.tensor([7, 3]))
    shapes = {"emb": {0: batch, 1: steps}, "lengths": {0: batch}}  # keyed by the forward arguments
    export_scan_graph(SentenceEncoder(model), example, ["emb", "len"], ["embedding"], shapes, encoder_path)
    width = model.embedding_width
    pair = (torch.randn(2, width), torch.randn(2, width))
    shapes = {"embedding_a": {0: batch}, "embedding_b": {0: batch}}
    export_graph(PairHead(model), pair, ["embedding_a", "embedding_b"], PAIR_OUTPUTS, shapes, head_path)


def padded(sentences: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Encoder feeds for a batch of embedded sentences, zero-padded to the longest."""
    emb = np.zeros((len(sentences), max(map(len, sentences)), sentences[0].shape[1]), dtype=np.float32)
    for row, sentence in enumerate(sentences):
        emb[row, : len(sentence)] = sentence
    return {"emb": emb, "len": np.array([len(sentence) for sentence in sentences], dtype=np.int64)}


class Graphs:
    """The pair, encoder and head graphs of one model on onnxruntime (CPU)."""

    def __init__(self, pair: Path, encoder: Path, head: Path) -> None:
        def open_session(path: Path) -> ort.InferenceSession:
            return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        self.pair, self.encoder, self.head = open_session(pair), open_session(encoder), open_session(head)

    def embed(self, sentences: list[np.ndarray]) -> np.ndarray:
        """Sentence vectors [N, 2M], in batches of sentences of similar length."""
        order = np.argsort([len(sentence) for sentence in sentences], kind="stable")
        batches = [order[start : start + EVALUATION_BATCH] for start in range(0, len(order), EVALUATION_BATCH)]
        found = np.concatenate(
            [self.encoder.run(None, padded([sentences[row] for row in rows]))[0] for rows in batches]
        )
        vectors = np.empty_like(found)
        vectors[order] = found
        return vectors

    def score(self, u: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
        return self.head.run(PAIR_OUTPUTS, {"embedding_a": u, "embedding_b": v})

    def score_pairs(self, a: list[np.ndarray], b: list[np.ndarray]) -> list[np.ndarray]:
        """The pair graph's outputs for the pairs (a[i], b[i]), in batches."""
        parts = []
        for start in range(0, len(a), EVALUATION_BATCH):
            feeds_a = padded(a[start : start + EVALUATION_BATCH])
            feeds_b = padded(b[start : start + EVALUATION_BATCH])
            length = max(feeds_a["emb"].shape[1], feeds_b["emb"].shape[1])
            feeds = {}
            for side, part in (("a", feeds_a), ("b", feeds_b)):
                emb = part["emb"]
                feeds[f"emb_{side}"] = np.pad(emb, ((0, 0), (0, length - emb.shape[1]), (0, 0)))
                feeds[f"len_{side}"] = part["len"]
            parts.append(self.pair.run(PAIR_OUTPUTS, feeds))
        return [np.concatenate(outputs) for outputs in zip(*parts, strict=True)]


def embedded_pairs(vectors: WordVectors, pairs: list[SickPair]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return (
        [vectors.embed(tokenize(pair.sentence_a))[0] for pair in pairs],
        [vectors.embed(tokenize(pair.sentence_b))[0] for pair in pairs],
    )


def cosine(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(x.astype(np.float64), y.astype(np.float64))[0, 1])


def evaluate(graphs: Graphs, vectors: WordVectors, pairs: list[SickPair]) -> dict[str, float]:
    """Pearson r with the gold relatedness: cosine of the two sentence vectors, and the head on them."""
    a, b = embedded_pairs(vectors, pairs)
    u, v = graphs.embed(a), graphs.embed(b)
    gold = np.array([pair.relatedness for pair in pairs])
    _, relatedness, _ = graphs.score(u, v)
    return {
        "cosine_pearson": pearson(cosine(u, v), gold),
        "head_pearson": pearson(relatedness, gold),
        "pairs": len(pairs),
    }


def parity(graphs: Graphs, vectors: WordVectors, pairs: list[SickPair]) -> float:
    """Max |encoder + head graphs - pair graph| over the three pair outputs."""
    a, b = embedded_pairs(vectors, pairs)
    derived = graphs.score(graphs.embed(a), graphs.embed(b))
    direct = graphs.score_pairs(a, b)
    return max(float(np.abs(x - y).max()) for x, y in zip(derived, direct, strict=True))


def rebuild_parity(model: SentencePairModel, graphs: Graphs, vectors: WordVectors, pairs: list[SickPair]) -> float:
    """Max |rebuilt PyTorch model (Python loop) - pair graph| over the three pair outputs."""
    a, b = embedded_pairs(vectors, pairs)
    feeds_a, feeds_b = padded(a), padded(b)
    with torch.no_grad():
        u = model.sentence_vector(torch.from_numpy(feeds_a["emb"]), torch.from_numpy(feeds_a["len"]))
        v = model.sentence_vector(torch.from_numpy(feeds_b["emb"]), torch.from_numpy(feeds_b["len"]))
        expected = model.score_pair(u, v)
    direct = graphs.score_pairs(a, b)
    return max(float(np.abs(e.numpy() - d).max()) for e, d in zip(expected, direct, strict=True))


def single_model_vector_text(width: int) -> str:
    """What the sentence vector of one pair model is, for the card."""
    return (
        f"`POST /embeddings` returns the sentence vector this model's heads read: {width} floats, the final "
        f"{width // 2}-wide memory after reading the sentence forward, then the final memory after reading it "
        "reversed (`u = [m_fwd; m_bwd]`). `POST /similarity/from-embeddings` runs only the two heads on two "
        "such vectors, on the features `[u, v, |u - v|, u * v]`, and returns the same relatedness and "
        "entailment as `POST /similarity` for that pair, without encoding again."
    )


def card_section(
    name: str, entry: dict, trial: dict, test: dict, checks: dict, command: str, vector_text: str = ""
) -> str:
    width = entry["metadata"]["embedding_dim"]
    ensemble = "members" in entry["metadata"]
    return "\n".join(
        [
            CARD_HEADING,
            "",
            vector_text or single_model_vector_text(width),
            "",
            "| SICK-R, Pearson r with the gold relatedness | trial | test |",
            "|---|---|---|",
            f"| cosine of the two sentence vectors | {trial['cosine_pearson']:.4f} | {test['cosine_pearson']:.4f} |",
            f"| the full pair head on the same vectors | {trial['head_pearson']:.4f} | {test['head_pearson']:.4f} |",
            "",
            f"Trial {trial['pairs']} pairs, test {test['pairs']} pairs; test numbers were not used for any choice. "
            "The cosine trails the pair head: the encoder was trained only through the heads, which read the "
            "difference and the product of the two vectors, not their angle. To score two stored vectors as "
            "/similarity does, use `/similarity/from-embeddings`.",
            "",
            f"- Graphs: `{entry['graphs']['encoder']['file']}` (`emb` [B,T,50], `len` [B] -> `embedding` "
            f"[B,{width}]) and `{entry['graphs']['head']['file']}` (`embedding_a`, `embedding_b` [B,{width}] -> "
            "`relatedness_log_probs`, `relatedness`, `entailment_logits`), "
            + (
                f"exported from the same PyTorch ensemble as `{entry['file']}`"
                if ensemble
                else f"both built from the weights stored in `{entry['file']}` (read back from its initializers)"
            )
            + ", so they serve exactly the weights of /similarity.",
            f"- Parity: the {'PyTorch ensemble' if ensemble else 'rebuilt PyTorch model'} against `{entry['file']}` on "
            "64 SICK trial pairs, max abs diff "
            f"{checks['rebuild']:.2e}; encoder + head graphs against the pair graph on all {trial['pairs']} trial "
            f"pairs, max abs diff {checks['derived']:.2e} (tolerance {PARITY_TOLERANCE:g}).",
            f"- At most {entry['limits']['max_sentences']} sentences per request, each within the token limit above.",
            f"- Command: `{command}`",
            "",
        ]
    )


def with_section(card: str, section: str) -> str:
    """The card with its embeddings section replaced, or inserted before `## Export` (else appended)."""
    start = card.find(CARD_HEADING)
    if start >= 0:
        following = card.find("\n## ", start + len(CARD_HEADING))
        return card[:start] + section + ("\n" + card[following + 1 :] if following >= 0 else "")
    export = card.find("\n## Export")
    if export >= 0:
        return card[: export + 1] + section + "\n" + card[export + 1 :]
    return card.rstrip("\n") + "\n\n" + section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="a similarity model in the manifest, e.g. rmc-vlmp-sick")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--data-dir", type=Path, default=data_dir_default() / "sick")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    entries = {entry["name"]: entry for entry in load_manifest(args.artifacts)["models"]}
    if entries.get(args.name, {}).get("task") != "similarity":
        raise SystemExit(f"{args.name} is not a similarity model of {args.artifacts / 'manifest.json'}")
    entry = entries[args.name]
    metadata = entry["metadata"]
    if "members" in metadata:
        raise SystemExit(f"{args.name} is an ensemble: its embedding graphs come from export.similarity_ensemble")
    pair_file = args.artifacts / entry["file"]
    model = model_from_pair_graph(pair_file, metadata["pointer"], metadata["window"], metadata["heads"])
    command = f"python -m export.embeddings --name {args.name}"
    add_embedding_graphs(model, args.name, entry, args.artifacts, args.data_dir, command)


def add_embedding_graphs(
    model: torch.nn.Module,
    name: str,
    entry: dict,
    artifacts: Path,
    data_dir: Path,
    command: str,
    vector_text: str = "",
    embedding_text: str = "final memory of the forward pass, then of the backward pass",
) -> dict:
    """Export the encoder and head graphs of `model` (a pair model or an ensemble of them), check them against
    the pair graph `entry["file"]`, evaluate them, and add them to the manifest entry and the card."""
    pair_file = artifacts / entry["file"]
    encoder_file, head_file = (artifacts / f"{name}.{part}.onnx" for part in ("encoder", "head"))
    export_graphs(model, encoder_file, head_file)
    graphs = Graphs(pair_file, encoder_file, head_file)
    vectors = WordVectors.from_glove(np.load(artifacts / entry["assets"]["special_vectors"]["file"]))
    trial = read_split(data_dir / SPLIT_FILES["trial"])
    test = read_split(data_dir / SPLIT_FILES["test"])
    checks = {"rebuild": rebuild_parity(model, graphs, vectors, trial[:64]), "derived": parity(graphs, vectors, trial)}
    if max(checks.values()) > PARITY_TOLERANCE:
        raise SystemExit(f"parity failed: {checks} (tolerance {PARITY_TOLERANCE})")
    trial_scores, test_scores = evaluate(graphs, vectors, trial), evaluate(graphs, vectors, test)
    entry["graphs"] = {"encoder": {"file": encoder_file.name}, "head": {"file": head_file.name}}
    entry["limits"] = {**entry["limits"], "max_sentences": MAX_SENTENCES}
    entry["metadata"] = {**entry["metadata"], "embedding_dim": model.embedding_width, "embedding": embedding_text}
    entry["metrics"] = {
        **entry["metrics"],
        "trial_embedding_cosine_pearson": round(trial_scores["cosine_pearson"], 4),
        "test_embedding_cosine_pearson": round(test_scores["cosine_pearson"], 4),
    }
    entry = upsert_model(artifacts, entry)
    card = artifacts / entry["card"]
    section = card_section(name, entry, trial_scores, test_scores, checks, command, vector_text)
    card.write_text(with_section(card.read_text(), section))
    sizes = ", ".join(f"{path.name} {path.stat().st_size / 1e6:.1f} MB" for path in (encoder_file, head_file))
    print(
        f"{name}: {sizes}; parity rebuilt {checks['rebuild']:.2e}, derived {checks['derived']:.2e}; Pearson r "
        f"cosine trial {trial_scores['cosine_pearson']:.4f} test {test_scores['cosine_pearson']:.4f}, "
        f"head trial {trial_scores['head_pearson']:.4f} test {test_scores['head_pearson']:.4f}"
    )
    return entry


if __name__ == "__main__":
    main()
