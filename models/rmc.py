"""LSTM_RMC sentence-pair model: a Relational Memory Core encoder (Ahmed & Mercer 2020) with two heads.

Follows docs/MODELS.md §1 and §3. One memory slot (S = 1); H heads of size d_h = d_k;
memory width M = H * d_h. Two memory pointers:

* FLMP: each step attends over [memory; projected token t] with the joint `LayerNorm([2, F])`.
* VLMP: each step attends over [memory; projected tokens t-w+1..t] (window w) with per-row
  LayerNorm `gain * (z - mean) / (unbiased std + 1e-3) + bias`. Only the memory row is kept after the
  step, and with per-row norms its token rows' keys/values do not depend on the memory, so they are
  computed once for all steps before the loop (exact; docs/MODELS.md §1.3).

Every step: gates i, f = sigmoid(W_i P_t + U tanh(M_{t-1}) + biases), M_t = i * tanh(M~) + f * M_{t-1}.
Padded steps (t >= length) leave the memory unchanged and return zero attention. The encoder runs each
sentence forward and reversed within its own length; the four passes of a pair run as one batch.

Deviations from the spec, recorded in the model cards: width M = 256 (8 x 32) instead of 512, and one
encoder shared by the relatedness and the entailment heads, trained jointly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from models.unroll import unroll

MASK_VALUE = -1e9


@dataclass(frozen=True)
class RMCConfig:
    """Sizes of the LSTM_RMC pair model."""

    pointer: str = "vlmp"  # "vlmp" | "flmp"
    window: int = 5  # VLMP window w
    embed_dim: int = 50
    num_heads: int = 8
    head_size: int = 32
    mlp_layers: int = 2
    fc_dim: int = 512
    dropout_relatedness: float = 0.4
    dropout_entailment: float = 0.25

    @property
    def mem_size(self) -> int:
        return self.num_heads * self.head_size

    def to_dict(self) -> dict:
        return asdict(self)


class RowLayerNorm(nn.Module):
    """The VLMP code's per-row norm: gain * (z - mean) / (unbiased std + 1e-3) + bias, over features."""

    def __init__(self, features: int, eps: float = 1e-3) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return row_norm(z, self.gain, self.bias, self.eps)


def row_norm(z: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """gain * (z - mean) / (unbiased std + eps) + bias over the last axis (gain and bias broadcast)."""
    mean = z.mean(-1, keepdim=True)
    std = (z - mean).pow(2).sum(-1, keepdim=True).div(z.shape[-1] - 1).sqrt()
    return gain * (z - mean) / (std + eps) + bias


class VariableLengthPointer:
    """VLMP: the memory attends over itself and the last `window` tokens (docs/MODELS.md §1.2).

    Norms are per row, so the token rows' keys and values do not depend on the memory: they are computed
    for all steps before the time loop, and each step only projects the memory row (docs/MODELS.md §1.3).
    """

    def __init__(self, window: int) -> None:
        self.window = window

    @staticmethod
    def norm(shape: int) -> nn.Module:
        return RowLayerNorm(shape)

    def step_inputs(self, core: RelationalMemory, projected: torch.Tensor, lengths: torch.Tensor):
        """Window keys and values [B,T,w,H,d] and the key mask bias [B,T,w] of every step."""
        w, t = self.window, projected.shape[1]
        _, k, v = core.split_heads(core.qkv_layernorm(core.qkv_projector(projected)))  # [B,T,H,d]
        pad = k.new_zeros(k.shape[0], w - 1, *k.shape[2:])
        k, v = torch.cat([pad, k], dim=1), torch.cat([pad, v], dim=1)
        keys_window = torch.stack([k[:, j : j + t] for j in range(w)], dim=2)  # row j = token t-w+1+j
        values_window = torch.stack([v[:, j : j + t] for j in range(w)], dim=2)
        steps = torch.arange(t, device=projected.device)
        source = steps.unsqueeze(1) - (w - 1) + torch.arange(w, device=projected.device).unsqueeze(0)  # [T,w]
        window_valid = (source.unsqueeze(0) >= 0) & (source.unsqueeze(0) < lengths.view(-1, 1, 1))  # [B,T,w]
        return keys_window, values_window, (~window_valid).to(projected.dtype) * MASK_VALUE

    @staticmethod
    def attend(core: RelationalMemory, memory: torch.Tensor, inputs_t):
        """Candidate memory [B,M] and the memory row's attention [B,H,1+w] (index 0: the memory itself)."""
        keys_window, values_window, key_bias = inputs_t
        q, k, v = core.split_heads(core.qkv_layernorm(core.qkv_projector(memory)))  # [B,H,d]
        keys = torch.cat([k.unsqueeze(1), keys_window], dim=1)  # [B,1+w,H,d]
        values = torch.cat([v.unsqueeze(1), values_window], dim=1)
        bias = torch.cat([key_bias.new_zeros(key_bias.shape[0], 1), key_bias], dim=1)  # [B,1+w]
        logits = torch.einsum("bhd,bnhd->bhn", q * core.config.head_size**-0.5, keys) + bias.unsqueeze(1)
        attention = torch.softmax(logits, dim=-1)
        attended = torch.einsum("bhn,bnhd->bhd", attention, values).reshape(memory.shape)  # heads concatenated
        return core.residual_mlp(memory, attended), attention


class FixedLengthPointer:
    """FLMP: the memory attends over itself and the current token, both rows through one joint
    `LayerNorm([2, F])` (docs/MODELS.md §1.2); the memory row's result becomes the candidate."""

    @staticmethod
    def norm(shape: int) -> nn.Module:
        return nn.LayerNorm([2, shape])

    @staticmethod
    def step_inputs(core: RelationalMemory, projected: torch.Tensor, lengths: torch.Tensor):
        """The projected token [B,T,M] of every step (the joint norm mixes it with the memory row)."""
        return (projected,)

    @staticmethod
    def attend(core: RelationalMemory, memory: torch.Tensor, inputs_t):
        """Candidate memory [B,M] and the memory row's attention [B,H,2] (index 0: the memory itself)."""
        (token,) = inputs_t
        rows = torch.stack([memory, token], dim=1)  # [B,2,M]
        q, k, v = (t.transpose(1, 2) for t in core.split_heads(core.qkv_layernorm(core.qkv_projector(rows))))
        attention = torch.softmax((q * core.config.head_size**-0.5) @ k.transpose(-1, -2), dim=-1)  # [B,H,2,2]
        attended = (attention @ v).transpose(1, 2).reshape(rows.shape)  # [B,2,M]
        return core.residual_mlp(rows, attended)[:, 0], attention[:, :, 0]


def memory_pointer(config: RMCConfig) -> VariableLengthPointer | FixedLengthPointer:
    """The step strategy of `config.pointer`."""
    if config.pointer == "vlmp":
        return VariableLengthPointer(config.window)
    if config.pointer == "flmp":
        return FixedLengthPointer()
    raise ValueError(f"pointer must be 'vlmp' or 'flmp', not {config.pointer!r}")


class RelationalMemory(nn.Module):
    """The RMC core with one slot; `encode` runs it over a batch of padded sentences.

    The pointer (VLMP or FLMP) decides what the memory attends to in each step and which layer norm the
    attention block uses; the projections, the MLP and the gates are shared by both.
    """

    def __init__(self, config: RMCConfig) -> None:
        super().__init__()
        self.config = config
        self.pointer = memory_pointer(config)
        m, h, d = config.mem_size, config.num_heads, config.head_size
        self.qkv_width = 3 * d  # per head: query, key (d_k = d_h) and value
        self.input_projector = nn.Linear(config.embed_dim, m)
        self.qkv_projector = nn.Linear(m, h * self.qkv_width)
        self.qkv_layernorm = self.pointer.norm(h * self.qkv_width)
        self.attended_memory_layernorm = self.pointer.norm(m)
        self.attended_memory_layernorm2 = self.pointer.norm(m)
        self.attention_mlp = nn.ModuleList(nn.Linear(m, m) for _ in range(config.mlp_layers))
        self.input_gate_projector = nn.Linear(m, 2 * m)
        self.memory_gate_projector = nn.Linear(m, 2 * m)
        self.input_bias = nn.Parameter(torch.tensor(0.0))
        self.forget_bias = nn.Parameter(torch.tensor(1.0))
        initial = torch.zeros(1, m)
        initial[0, 0] = 1.0  # eye(S) padded to width M: the constant one-hot e_1
        self.register_buffer("initial_memory", initial)

    def split_heads(self, qkv: torch.Tensor):
        """[..., H*3d] -> q, k, v each [..., H, d]."""
        d = self.config.head_size
        qkv = qkv.reshape(*qkv.shape[:-1], self.config.num_heads, self.qkv_width)
        return qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]

    def mlp(self, z: torch.Tensor) -> torch.Tensor:
        for layer in self.attention_mlp:
            z = torch.relu(layer(z))
        return z

    def residual_mlp(self, rows: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the attention block: residual + norm, then MLP + residual + norm."""
        z = self.attended_memory_layernorm(rows + attended)
        return self.attended_memory_layernorm2(z + self.mlp(z))

    def gate(self, memory, candidate, input_gate):
        """M_t = sigmoid(i) * tanh(M~) + sigmoid(f) * M_{t-1}; gates from P_t and tanh(M_{t-1})."""
        gates = input_gate + self.memory_gate_projector(torch.tanh(memory))
        i, f = gates.chunk(2, dim=-1)
        return torch.sigmoid(i + self.input_bias) * torch.tanh(candidate) + torch.sigmoid(f + self.forget_bias) * memory

    def _step(self, memory, inputs_t):
        """One token: attend (pointer), gate, then freeze the memory and zero the attention on padded steps."""
        *pointer_inputs, input_gate, valid = inputs_t
        candidate, attention = self.pointer.attend(self, memory, pointer_inputs)
        keep = valid.unsqueeze(-1)  # [B,1]
        new_memory = keep * self.gate(memory, candidate, input_gate) + (1 - keep) * memory
        return new_memory, (attention * keep.unsqueeze(-1),)

    def encode(self, x: torch.Tensor, lengths: torch.Tensor, use_scan: bool = False):
        """x [B,T,D], lengths [B] -> final memory [B,M] and memory-row attention [B,T,H,K]."""
        valid = (torch.arange(x.shape[1], device=x.device).unsqueeze(0) < lengths.unsqueeze(1)).to(x.dtype)  # [B,T]
        projected = self.input_projector(x)  # P: [B,T,M]
        inputs = (*self.pointer.step_inputs(self, projected, lengths), self.input_gate_projector(projected), valid)
        memory = self.initial_memory.expand(x.shape[0], -1).contiguous()
        memory, (attention,) = unroll(self._step, memory, inputs, use_scan)
        return memory, attention


def reverse_within_length(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence of x [B,T,...] within its own length; padding stays at the end."""
    steps = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # [1,T]
    index = torch.where(steps < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - steps, steps)  # [B,T]
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return torch.gather(x, 1, index)


def _pair_head(in_features: int, fc_dim: int, classes: int, dropout: float) -> nn.Sequential:
    """Dropout -> Linear -> Tanh -> Dropout -> Linear -> Tanh -> Dropout -> Linear (docs/MODELS.md §1.5)."""
    return nn.Sequential(
        nn.Dropout(dropout),
        nn.Linear(in_features, fc_dim),
        nn.Tanh(),
        nn.Dropout(dropout),
        nn.Linear(fc_dim, fc_dim),
        nn.Tanh(),
        nn.Dropout(dropout),
        nn.Linear(fc_dim, classes),
    )


class SentencePairModel(nn.Module):
    """Siamese RMC encoder + relatedness (5-way, SICK-R) and entailment (3-way, SICK-E) heads.

    Inputs: word vectors emb_a, emb_b [B,T,D] (both padded to the same T) and lengths len_a, len_b [B].
    Outputs: relatedness log-probabilities [B,5], relatedness score [B] = sum_i i * p_i, entailment
    logits [B,3], and the memory-row attention [B,T,H,K] of the four passes (a fwd, a bwd, b fwd, b bwd).
    """

    def __init__(self, config: RMCConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = RelationalMemory(config)
        features = 8 * config.mem_size  # [u, v, |u-v|, u*v], u = [forward; backward]
        self.relatedness_head = _pair_head(features, config.fc_dim, 5, config.dropout_relatedness)
        self.entailment_head = _pair_head(features, config.fc_dim, 3, config.dropout_entailment)
        self.register_buffer("score_levels", torch.arange(1, 6, dtype=torch.float32))

    def forward(self, emb_a, len_a, emb_b, len_b, use_scan: bool = False):
        x = torch.cat([emb_a, reverse_within_length(emb_a, len_a), emb_b, reverse_within_length(emb_b, len_b)])
        lengths = torch.cat([len_a, len_a, len_b, len_b])
        memory, attention = self.encoder.encode(x, lengths, use_scan=use_scan)  # [4B,M], [4B,T,H,K]
        a_fwd, a_bwd, b_fwd, b_bwd = memory.reshape(4, -1, memory.shape[-1]).unbind(0)
        u, v = torch.cat([a_fwd, a_bwd], dim=-1), torch.cat([b_fwd, b_bwd], dim=-1)
        return (*self.score_pair(u, v), *attention.reshape(4, -1, *attention.shape[1:]).unbind(0))

    @property
    def embedding_width(self) -> int:
        """Width of the sentence vector: the [forward; backward] final memory."""
        return 2 * self.config.mem_size

    def sentence_vector(self, emb: torch.Tensor, lengths: torch.Tensor, use_scan: bool = False) -> torch.Tensor:
        """The sentence vector the heads read, [B, 2M]: final memory of the forward pass, then of the backward pass."""
        memory, _ = self.encoder.encode(
            torch.cat([emb, reverse_within_length(emb, lengths)]), lengths.repeat(2), use_scan
        )
        forward, backward = memory.reshape(2, -1, memory.shape[-1]).unbind(0)
        return torch.cat([forward, backward], dim=-1)

    def score_pair(self, u: torch.Tensor, v: torch.Tensor):
        """Both heads on two sentence vectors [B, 2M]: relatedness log-probabilities, score, entailment logits."""
        features = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)
        relatedness_log_probs = torch.log_softmax(self.relatedness_head(features), dim=-1)
        score = (relatedness_log_probs.exp() * self.score_levels).sum(-1)
        return relatedness_log_probs, score, self.entailment_head(features)
