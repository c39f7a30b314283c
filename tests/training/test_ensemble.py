"""models/ensemble.py: the stacked ensemble gives the average of its members, run one by one."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the ensemble needs the train extra")

import torch

from models.ensemble import EnsemblePairModel
from models.rmc import RMCConfig, SentencePairModel

SMALL = {"num_heads": 2, "head_size": 8, "fc_dim": 16}


POINTERS = ("vlmp", "flmp")


def members(count: int, **sizes) -> list[SentencePairModel]:
    """Untrained members with distinct weights (gate biases and norms moved off their shared initial values too)."""
    made = []
    for seed in range(count):
        torch.manual_seed(seed)
        model = SentencePairModel(RMCConfig(**{**SMALL, **sizes}))
        with torch.no_grad():
            model.encoder.input_bias.fill_(0.1 * seed)
            model.encoder.forget_bias.fill_(1.0 - 0.2 * seed)
            for name, parameter in model.encoder.named_parameters():
                if "layernorm" in name:
                    parameter.add_(0.2 * torch.randn_like(parameter))
        made.append(model.eval())
    return made


def pair_batch() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(7)
    return (
        torch.randn(3, 9, 50, generator=generator),
        torch.tensor([9, 4, 6]),
        torch.randn(3, 9, 50, generator=generator),
        torch.tensor([2, 9, 5]),
    )


@pytest.mark.parametrize("pointer", POINTERS)
@torch.no_grad()
def test_the_ensemble_averages_its_members_distributions_and_attention(pointer):
    models = members(3, pointer=pointer)
    ensemble = EnsemblePairModel(models).eval()
    outputs = [model(*pair_batch()) for model in models]
    combined = ensemble(*pair_batch())
    relatedness = torch.stack([out[0].exp() for out in outputs]).mean(0)
    torch.testing.assert_close(combined[0].exp(), relatedness, atol=1e-5, rtol=0)
    torch.testing.assert_close(combined[1], (relatedness * torch.arange(1.0, 6.0)).sum(-1), atol=1e-5, rtol=0)
    entailment = torch.stack([out[2].softmax(-1) for out in outputs]).mean(0)
    torch.testing.assert_close(combined[2].softmax(-1), entailment, atol=1e-5, rtol=0)
    for index in range(3, 7):
        mean_map = torch.stack([out[index] for out in outputs]).mean(0)
        torch.testing.assert_close(combined[index], mean_map, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pointer", POINTERS)
@torch.no_grad()
@pytest.mark.slow
def test_heads_of_different_widths_and_the_scan_path_give_the_same_numbers(pointer):
    models = [*members(1, pointer=pointer), *members(1, pointer=pointer, fc_dim=24)]
    ensemble = EnsemblePairModel(models).eval()
    for loop, scan in zip(ensemble(*pair_batch()), ensemble(*pair_batch(), use_scan=True), strict=True):
        torch.testing.assert_close(loop, scan, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pointer", POINTERS)
@torch.no_grad()
def test_encoder_and_heads_alone_give_the_pair_outputs(pointer):
    ensemble = EnsemblePairModel(members(2, pointer=pointer)).eval()
    emb_a, len_a, emb_b, len_b = pair_batch()
    u, v = ensemble.sentence_vector(emb_a, len_a), ensemble.sentence_vector(emb_b, len_b)
    assert u.shape == (3, ensemble.embedding_width) == (3, 2 * 2 * 16)
    for alone, paired in zip(ensemble.score_pair(u, v), ensemble(emb_a, len_a, emb_b, len_b)[:3], strict=True):
        torch.testing.assert_close(alone, paired, atol=1e-6, rtol=0)


def test_members_must_share_the_pointer_and_encoder_sizes():
    with pytest.raises(ValueError, match="encoder sizes"):
        EnsemblePairModel([*members(1), *members(1, head_size=4)])
    with pytest.raises(ValueError, match="pointer"):
        EnsemblePairModel([*members(1), *members(1, pointer="flmp")])
