"""Several trained LSTM_RMC pair models run as one: their encoders stacked into one recurrent pass.

The members must share the pointer (VLMP or FLMP) and every encoder size (they may differ in their heads).
Their encoders run as one recurrent pass over a batch of `N x` the rows, member-major: every Linear layer
applies each member's weights to that member's rows, every norm (VLMP's per-row norm, FLMP's joint norm over
one batch row's memory and token rows) and gate bias each member's own parameters. The attention, masking
and scan run once for all members; the arithmetic still grows N-fold, so the ensemble costs more than one
model (the measured latency against one model is in the card).

Outputs are those of `SentencePairModel`, combined as an ensemble average:
- relatedness: the mean of the members' distributions over 1..5 (log of it, and its expected score);
- entailment: `log` of the mean of the members' probabilities (a softmax gives back that mean);
- attention maps: the mean of the members' maps.
The sentence vector is the concatenation of the members' vectors, and `score_pair` reads each member's
slice with that member's heads, so encoder + heads give exactly the pair outputs.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.rmc import RelationalMemory, RMCConfig, RowLayerNorm, SentencePairModel, reverse_within_length, row_norm


class StackedLinear(nn.Module):
    """N Linear layers of one shape; input rows [N*R, ..., in] member-major, member n's rows through layer n.

    One 2-D matrix product per member: onnxruntime ran a single batched [N,R,in] @ [N,in,out] MatMul about
    1.7x slower than N Gemms at the sizes of one time step (batch 1, 15-token pairs, one thread)."""

    def __init__(self, layers: list[nn.Linear]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach().T for layer in layers]))  # [N,in,out]
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))  # [N,out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, width = self.weight.shape[0], self.weight.shape[-1]
        rows = x.reshape(members, -1, x.shape[-1]).unbind(0)
        out = torch.cat([torch.addmm(self.bias[n], part, self.weight[n]) for n, part in enumerate(rows)])
        return out.reshape(*x.shape[:-1], width)


class StackedRowLayerNorm(nn.Module):
    """N `RowLayerNorm`s; input rows [N*R, ..., F] member-major, member n's rows with norm n's gain and bias."""

    def __init__(self, norms: list[RowLayerNorm]) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.stack([norm.gain.detach() for norm in norms]).unsqueeze(1))  # [N,1,F]
        self.bias = nn.Parameter(torch.stack([norm.bias.detach() for norm in norms]).unsqueeze(1))
        self.eps = norms[0].eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        per_member = z.reshape(self.gain.shape[0], -1, z.shape[-1])
        return row_norm(per_member, self.gain, self.bias, self.eps).reshape(z.shape)


class StackedJointLayerNorm(nn.Module):
    """N FLMP `LayerNorm([2, F])`s; input [N*R, 2, F] member-major, member n's rows with norm n's weight and bias.

    The joint norm's statistics are per batch row (over its memory and token rows together), so they do not
    depend on the member: one affine-free norm for all, then each member's own weight and bias."""

    def __init__(self, norms: list[nn.LayerNorm]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.stack([norm.weight.detach() for norm in norms]).unsqueeze(1))  # [N,1,2,F]
        self.bias = nn.Parameter(torch.stack([norm.bias.detach() for norm in norms]).unsqueeze(1))
        self.shape = tuple(norms[0].normalized_shape)
        self.eps = norms[0].eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        normed = torch.nn.functional.layer_norm(z, self.shape, eps=self.eps)
        per_member = normed.reshape(self.weight.shape[0], -1, *self.shape)
        return (per_member * self.weight + self.bias).reshape(z.shape)


STACKED_NORM_TYPES = {"vlmp": StackedRowLayerNorm, "flmp": StackedJointLayerNorm}
STACKED_LINEARS = ("input_projector", "qkv_projector", "input_gate_projector", "memory_gate_projector")
STACKED_NORMS = ("qkv_layernorm", "attended_memory_layernorm", "attended_memory_layernorm2")


class StackedRelationalMemory(RelationalMemory):
    """The RMC core of N members with equal sizes, run on member-major batches of N x the rows."""

    def __init__(self, cores: list[RelationalMemory]) -> None:
        config = cores[0].config
        super().__init__(config)
        self.members = len(cores)
        for name in STACKED_LINEARS:
            setattr(self, name, StackedLinear([getattr(core, name) for core in cores]))
        for name in STACKED_NORMS:
            setattr(self, name, STACKED_NORM_TYPES[config.pointer]([getattr(core, name) for core in cores]))
        self.attention_mlp = nn.ModuleList(
            StackedLinear([core.attention_mlp[layer] for core in cores]) for layer in range(config.mlp_layers)
        )
        self.input_bias = nn.Parameter(torch.stack([core.input_bias.detach() for core in cores]).view(-1, 1, 1))
        self.forget_bias = nn.Parameter(torch.stack([core.forget_bias.detach() for core in cores]).view(-1, 1, 1))

    def gate(self, memory, candidate, input_gate):
        """As `RelationalMemory.gate`, with each member's own gate biases."""
        gates = input_gate + self.memory_gate_projector(torch.tanh(memory))
        i, f = (part.reshape(self.members, -1, part.shape[-1]) for part in gates.chunk(2, dim=-1))
        i = torch.sigmoid(i + self.input_bias).reshape(memory.shape)
        f = torch.sigmoid(f + self.forget_bias).reshape(memory.shape)
        return i * torch.tanh(candidate) + f * memory


class EnsemblePairModel(nn.Module):
    """N `SentencePairModel`s of one pointer and equal encoder sizes as one model: same inputs and outputs
    (averaged)."""

    def __init__(self, members: list[SentencePairModel]) -> None:
        super().__init__()
        sizes = {_encoder_sizes(member.config) for member in members}
        if len(sizes) != 1:
            raise ValueError(f"members must share the pointer and encoder sizes, got {sorted(sizes)}")
        self.config = members[0].config
        self.members = len(members)
        self.encoder = StackedRelationalMemory([member.encoder for member in members])
        self.relatedness_heads = nn.ModuleList(member.relatedness_head for member in members)
        self.entailment_heads = nn.ModuleList(member.entailment_head for member in members)
        self.register_buffer("score_levels", torch.arange(1, 6, dtype=torch.float32))

    @property
    def embedding_width(self) -> int:
        """Width of the sentence vector: each member's [forward; backward] memory, concatenated."""
        return self.members * 2 * self.config.mem_size

    def _encode(self, x: torch.Tensor, lengths: torch.Tensor, use_scan: bool):
        """Every member on the same rows: final memory [N, R, M] and attention [N, R, T, H, K]."""
        memory, attention = self.encoder.encode(x.repeat(self.members, 1, 1), lengths.repeat(self.members), use_scan)
        return memory.reshape(self.members, -1, memory.shape[-1]), attention.reshape(
            self.members, -1, *attention.shape[1:]
        )

    def forward(self, emb_a, len_a, emb_b, len_b, use_scan: bool = False):
        x = torch.cat([emb_a, reverse_within_length(emb_a, len_a), emb_b, reverse_within_length(emb_b, len_b)])
        memory, attention = self._encode(x, torch.cat([len_a, len_a, len_b, len_b]), use_scan)
        a_fwd, a_bwd, b_fwd, b_bwd = memory.reshape(self.members, 4, -1, memory.shape[-1]).unbind(1)  # [N,B,M]
        u = torch.cat([a_fwd, a_bwd], dim=-1).transpose(0, 1).flatten(1)  # [B, N*2M], member-major
        v = torch.cat([b_fwd, b_bwd], dim=-1).transpose(0, 1).flatten(1)
        attention = attention.mean(0)  # [4B,T,H,K]
        return (*self.score_pair(u, v), *attention.reshape(4, -1, *attention.shape[1:]).unbind(0))

    def sentence_vector(self, emb: torch.Tensor, lengths: torch.Tensor, use_scan: bool = False) -> torch.Tensor:
        """[B, N*2M]: member by member, the final memory of the forward pass, then of the backward pass."""
        memory, _ = self._encode(torch.cat([emb, reverse_within_length(emb, lengths)]), lengths.repeat(2), use_scan)
        forward, backward = memory.reshape(self.members, 2, -1, memory.shape[-1]).unbind(1)  # [N,B,M]
        return torch.cat([forward, backward], dim=-1).transpose(0, 1).flatten(1)

    def score_pair(self, u: torch.Tensor, v: torch.Tensor):
        """Each member's heads on its slice of the two vectors; the averaged relatedness and entailment.

        Means of probabilities are taken in log space (logsumexp - log N), so no log ever sees a zero."""
        relatedness, entailment = [], []
        slices = zip(u.chunk(self.members, dim=-1), v.chunk(self.members, dim=-1), strict=True)
        for (u_n, v_n), r_head, e_head in zip(slices, self.relatedness_heads, self.entailment_heads, strict=True):
            features = torch.cat([u_n, v_n, (u_n - v_n).abs(), u_n * v_n], dim=-1)
            relatedness.append(torch.log_softmax(r_head(features), dim=-1))
            entailment.append(torch.log_softmax(e_head(features), dim=-1))
        log_members = math.log(self.members)
        relatedness_log_probs = torch.logsumexp(torch.stack(relatedness), dim=0) - log_members
        score = (relatedness_log_probs.exp() * self.score_levels).sum(-1)
        return relatedness_log_probs, score, torch.logsumexp(torch.stack(entailment), dim=0) - log_members


def _encoder_sizes(config: RMCConfig) -> tuple:
    return config.pointer, config.window, config.embed_dim, config.num_heads, config.head_size, config.mlp_layers
