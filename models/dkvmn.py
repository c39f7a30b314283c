"""DKVMN: Dynamic Key-Value Memory Network for knowledge tracing (Zhang et al., WWW 2017).

Follows docs/MODELS.md §2-3 and the authors' released code; `paper_head=True` switches the
predictor to the paper's variant (k_t fed directly instead of the code's tanh(W_h k_t)).

Shapes: B batch, T steps, Q questions, N memory slots (concepts), d_k key size, d_v value size.
Everything that does not depend on the memory (embeddings, correlation weights, erase and add terms)
is computed for all steps before the time loop; only the read needs the previous memory. The time loop
is `models.unroll.unroll`: a Python loop by default, one scan (an ONNX Scan node with dynamic batch and
length) when the exporter passes `use_scan=True`. `tests/` asserts that both agree.

Training (`training_logits`) runs the same operations with fewer autograd nodes per step (the reshapes are
done once for all steps, and for small memories the write's factors `1 - w e^T` and `w a^T` too), so its
logits and gradients equal the serving step's bit for bit (tests/training/test_dkvmn.py). A synthetic training epoch
(N=5) takes 0.56 s instead of 1.05 s at one thread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from models.unroll import unroll

QUESTION_HIDDEN = 50  # the code's hard-coded tanh(W_h k_t) width, absent from the paper
# Up to this many elements in [B,T,N,d_v], training computes the write factors of all steps before the loop;
# above it (ASSIST, STATICS) those tensors cost more memory traffic than the per-step nodes they save.
PRECOMPUTED_WRITE_LIMIT = 1 << 20


@dataclass(frozen=True)
class DKVMNConfig:
    """Sizes of one DKVMN (docs/MODELS.md §2.5)."""

    n_questions: int
    memory_size: int  # N, the number of latent concepts
    key_dim: int  # d_k
    value_dim: int  # d_v
    final_fc_dim: int = 50
    init_std: float = 0.1
    paper_head: bool = False
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class DKVMN(nn.Module):
    """Key memory M^k [N,d_k] (static), value memory M^v [B,N,d_v] updated by erase-then-add."""

    def __init__(self, config: DKVMNConfig) -> None:
        super().__init__()
        self.config = config
        q, n, dk, dv = config.n_questions, config.memory_size, config.key_dim, config.value_dim
        self.q_embed = nn.Embedding(q + 1, dk)  # A: question id -> key
        self.qa_embed = nn.Embedding(2 * q + 1, dv)  # B: interaction id q + r*Q -> value
        self.key_memory = nn.Parameter(torch.empty(n, dk))  # M^k
        self.init_value_memory = nn.Parameter(torch.empty(n, dv))  # M^v_0
        self.erase = nn.Linear(dv, dv)
        self.add = nn.Linear(dv, dv)
        predictor_extra = dk if config.paper_head else QUESTION_HIDDEN
        self.question_hidden = None if config.paper_head else nn.Linear(dk, QUESTION_HIDDEN)
        self.read_fc = nn.Linear(dv + predictor_extra, config.final_fc_dim)
        self.dropout = nn.Dropout(config.dropout)
        self.output = nn.Linear(config.final_fc_dim, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        """All weights N(0, init_std), biases 0, as in the released code."""
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            else:
                nn.init.normal_(parameter, std=self.config.init_std)

    # -- memory-independent terms, all steps at once ---------------------------------------------
    def correlation_weights(self, q: torch.Tensor) -> torch.Tensor:
        """w = softmax(A[q] M^k^T): [B,T] -> [B,T,N]; depends only on the question."""
        return torch.softmax(self.q_embed(q) @ self.key_memory.t(), dim=-1)

    def _question_features(self, q: torch.Tensor) -> torch.Tensor:
        """The question part of the predictor input: tanh(W_h k) [B,T,50] (code) or k [B,T,d_k] (paper)."""
        keys = self.q_embed(q)
        return keys if self.question_hidden is None else torch.tanh(self.question_hidden(keys))

    def _step_terms(self, q: torch.Tensor, r: torch.Tensor, lengths: torch.Tensor):
        """w [B,T,N], write weights [B,T,N] (0 on padded steps), erase e and add a [B,T,d_v]."""
        steps = torch.arange(q.shape[1], device=q.device)
        valid = (steps.unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float32)  # [B,T]
        interaction = (q + r * self.config.n_questions) * (q > 0).to(q.dtype)  # x = q + r*Q, 0 = padding
        values = self.qa_embed(interaction)  # [B,T,d_v]
        w = self.correlation_weights(q)  # [B,T,N]
        write_w = w * valid.unsqueeze(-1)  # padded steps write nothing: memory unchanged exactly
        return w, write_w, torch.sigmoid(self.erase(values)), torch.tanh(self.add(values))

    # -- the recurrence --------------------------------------------------------------------------
    @staticmethod
    def _read_and_write(memory, inputs_t):
        """Read with w from M_{t-1} [B,N,d_v], then erase-and-add with the write weights: (M_t, read [B,d_v])."""
        w, write_w, erase, add = inputs_t
        read = torch.bmm(w.unsqueeze(1), memory).squeeze(1)  # [B,d_v]
        ww = write_w.unsqueeze(-1)  # [B,N,1]
        memory = memory * (1 - ww * erase.unsqueeze(1)) + ww * add.unsqueeze(1)  # [B,N,d_v]
        return memory, read

    @staticmethod
    def _read_then_erase_add(memory, inputs_t):
        """Training step, inputs pre-shaped w [B,1,N], write weights [B,N,1], e and a [B,1,d_v]: (M_t, (read,))."""
        w, ww, erase, add = inputs_t
        return memory * (1 - ww * erase) + ww * add, (torch.bmm(w, memory),)

    @staticmethod
    def _read_then_keep_put(memory, inputs_t):
        """Training step with the write's factors precomputed, keep = 1 - w e^T and put = w a^T [B,N,d_v]."""
        w, keep, put = inputs_t
        return memory * keep + put, (torch.bmm(w, memory),)

    def _read_and_keep_memory_step(self, memory, inputs_t):
        """Serving step: the read and the memory after the step (for the mastery output)."""
        memory, read = self._read_and_write(memory, inputs_t)
        return memory, (read, memory)

    # -- heads -----------------------------------------------------------------------------------
    def _predict_logits(self, reads: torch.Tensor, question_features: torch.Tensor) -> torch.Tensor:
        """f = tanh(W_1 [read ; question part] + b_1); logit = w_2^T f + b_2 (any leading shape)."""
        hidden = torch.tanh(self.read_fc(torch.cat([reads, question_features], dim=-1)))
        return self.output(self.dropout(hidden)).squeeze(-1)

    def mastery(self, memories: torch.Tensor) -> torch.Tensor:
        """Concept mastery (docs/MODELS.md §2.6): read each slot alone, question part zeroed. [...,N,d_v] -> [...,N]."""
        extra = self.read_fc.in_features - self.config.value_dim
        zeros = memories.new_zeros((*memories.shape[:-1], extra))
        return torch.sigmoid(self._predict_logits(memories, zeros))

    def initial_memory(self, batch: int) -> torch.Tensor:
        """M^v_0 broadcast to [B,N,d_v]."""
        return self.init_value_memory.unsqueeze(0).expand(batch, -1, -1)

    def training_logits(self, q: torch.Tensor, r: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Logits [B,T] of answering each q_t correctly given steps < t (Python loop, memory reset)."""
        w, write_w, erase, add = self._step_terms(q, r, lengths)
        w, ww, erase, add = w.unsqueeze(2), write_w.unsqueeze(-1), erase.unsqueeze(2), add.unsqueeze(2)
        if ww.numel() * add.shape[-1] <= PRECOMPUTED_WRITE_LIMIT:
            step, terms = self._read_then_keep_put, (w, 1 - ww * erase, ww * add)
        else:
            step, terms = self._read_then_erase_add, (w, ww, erase, add)
        _, (reads,) = unroll(step, self.initial_memory(q.shape[0]), terms)
        return self._predict_logits(reads.squeeze(2), self._question_features(q))

    def forward(self, q, r, lengths, mv_in, use_scan: bool = False):
        """Serving graph: p [B,T], corr_w [B,T,N], mastery [B,T+1,N], mv_out [B,N,d_v].

        `mv_in` is the value memory to start from (M^v_0 for a new student, or a previous `mv_out` to
        carry a long history across chunks). Padded steps leave the memory unchanged, so mastery rows
        past a student's length repeat the last state and mv_out is the state after the last valid step.
        """
        terms = self._step_terms(q, r, lengths)  # (w, write weights, erase, add)
        final, (reads, memories) = unroll(self._read_and_keep_memory_step, mv_in, terms, use_scan)
        p = torch.sigmoid(self._predict_logits(reads, self._question_features(q)))
        mastery = self.mastery(torch.cat([mv_in.unsqueeze(1), memories], dim=1))
        return p, terms[0], mastery, final
