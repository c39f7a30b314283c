"""DKT: Deep Knowledge Tracing (Piech et al., NeurIPS 2015), the baseline the DKVMN paper compares with.

An LSTM reads one-hot interactions (question q answered r: index q + r·Q, 2Q classes) and a linear layer
maps its state to one logit per question. The logit for q_t is read from the state *before* interaction t,
so, as for DKVMN, step t predicts the answer to q_t from steps < t (the first step from the zero state).
Shapes: B batch, T steps, Q questions, S the LSTM state size.

Training runs `nn.LSTM` (`training_logits`). The serving graph (`forward`) runs the same LSTM one step at a
time through `models.unroll.unroll` (one ONNX Scan when exported), from a given state and back out, so a
history can be cut into chunks and resumed from the state the previous chunk ended with.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
from torch import nn

from models.unroll import unroll


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

    def forward(self, q, r, lengths, state_in, use_scan: bool = False):
        """Serving graph: p [B,T] = P(q_t correct | steps < t) and state_out [B,2,S] (h and c).

        `state_in` [B,2,S] is the LSTM state to start from: zeros for a new student, or a previous `state_out`
        to carry a long history across chunks. Steps at or past a row's length leave the state unchanged, so
        `state_out` is the state after the row's last valid step.
        """
        steps = torch.arange(q.shape[1], device=q.device)
        valid = (steps.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(-1)  # [B,T,1]
        # The step gets the recurrent weight, not the nn.LSTM module: dynamo's scan refuses to trace into an LSTM.
        step = functools.partial(lstm_step, self.lstm.weight_hh_l0.t())
        final, (hidden,) = unroll(step, state_in, (self._input_gates(q, r), valid), use_scan)
        before = torch.cat([state_in[:, :1], hidden[:, :-1]], dim=1)  # [B,T,S]: h before step t
        logits = self.output(before).gather(-1, (q - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return torch.sigmoid(logits), final

    def _input_gates(self, q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """W_ih x_t + b_ih + b_hh [B,T,4S] for the one-hot x_t of q_t + r_t·Q: a column lookup, not a matmul."""
        n = self.config.n_questions
        interaction = torch.where(q > 0, q - 1 + r * n, torch.zeros_like(q))  # padding: any column, masked later
        weights = self.lstm.weight_ih_l0.t()  # [2Q,4S]
        return nn.functional.embedding(interaction, weights) + self.lstm.bias_ih_l0 + self.lstm.bias_hh_l0

    def initial_state(self, batch: int) -> torch.Tensor:
        """The zero LSTM state [B,2,S] a history starts from (as `nn.LSTM` in training)."""
        return self.output.weight.new_zeros(batch, 2, self.config.hidden_dim)


def lstm_step(recurrent_weight: torch.Tensor, state: torch.Tensor, inputs_t: tuple[torch.Tensor, torch.Tensor]):
    """One `nn.LSTM` step (gates i, f, g, o) from state [B,2,S] given W_hh^T [S,4S] and the step's input gates
    [B,4S]; a padded step (valid [B,1] false) keeps the state as it was. Returns (state, (h,))."""
    gate_input, valid = inputs_t
    h, c = state.unbind(1)
    i, f, g, o = (gate_input + h @ recurrent_weight).chunk(4, dim=-1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h_new = torch.sigmoid(o) * torch.tanh(c_new)
    h_kept, c_kept = torch.where(valid, h_new, h), torch.where(valid, c_new, c)
    return torch.stack([h_kept, c_kept], dim=1), (h_kept,)
