"""DKT: Deep Knowledge Tracing (Piech et al., NeurIPS 2015), the baseline the DKVMN paper compares with.

An LSTM reads one-hot interactions (question q answered r: index q + r·Q, 2Q classes) and a linear layer
maps its state to one logit per question. The logit for q_t is read from the state *before* interaction t,
so, as for DKVMN, step t predicts the answer to q_t from steps < t (the first step from the zero state).
Shapes: B batch, T steps, Q questions, S the LSTM state size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class DKTConfig:
    """Sizes of one DKT model."""

    n_questions: int
    hidden_dim: int = 200
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class DKT(nn.Module):
    """One-hot interactions -> LSTM -> dropout -> Linear(S, Q) logits."""

    def __init__(self, config: DKTConfig) -> None:
        super().__init__()
        self.config = config
        self.lstm = nn.LSTM(2 * config.n_questions, config.hidden_dim, batch_first=True)
        self.dropout = nn.Dropout(config.dropout)
        self.output = nn.Linear(config.hidden_dim, config.n_questions)

    def training_logits(self, q: torch.Tensor, r: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Logits [B,T] of answering each q_t correctly given steps < t (padding: any value, masked later)."""
        n = self.config.n_questions
        valid = q > 0
        interaction = torch.where(valid, q - 1 + r * n, torch.zeros_like(q))
        x = nn.functional.one_hot(interaction, 2 * n).float() * valid.unsqueeze(-1)  # padding: zero input
        states, _ = self.lstm(x)  # [B,T,S], state after each step
        before = torch.cat([states.new_zeros(states.shape[0], 1, states.shape[2]), states[:, :-1]], dim=1)
        logits = self.output(self.dropout(before))  # [B,T,Q]
        question = (q - 1).clamp(min=0).unsqueeze(-1)
        return logits.gather(-1, question).squeeze(-1)
