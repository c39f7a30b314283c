"""Run a recurrent step over time: a Python loop for training, or one scan for the ONNX export.

Every recurrent model (LSTM_RMC, DKVMN and DKT's serving graph) uses this one helper, so the two paths cannot
drift apart, and all default to the loop (`use_scan=False`); only the exporters ask for the scan.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._higher_order_ops import scan

Step = Callable[[torch.Tensor, tuple[torch.Tensor, ...]], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]


def unroll(
    step: Step, carry: torch.Tensor, inputs: tuple[torch.Tensor, ...], use_scan: bool = False
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Apply `step(carry, inputs_t) -> (carry, outputs_t)` for t = 0..T-1.

    `inputs` are batch-major `[B,T,...]` tensors; returns the final carry and each output stacked to
    `[B,T,...]`. The loop and the scan give the same numbers (tests/training/test_rmc.py, tests/training/test_dkvmn.py).
    """
    if use_scan:
        return _scan(step, carry, inputs)
    per_step = []
    for inputs_t in zip(*(t.unbind(1) for t in inputs), strict=True):
        carry, outputs_t = step(carry, inputs_t)
        per_step.append(outputs_t)
    return carry, tuple(torch.stack(output, dim=1) for output in zip(*per_step, strict=True))


def _scan(step: Step, carry: torch.Tensor, inputs: tuple[torch.Tensor, ...]):
    """`torch._higher_order_ops.scan` over time-major inputs, exported as one ONNX Scan node."""

    def body(state, inputs_t):
        new_state, outputs_t = step(state, inputs_t)
        # scan refuses a body that returns the same tensor twice ("Output-to-output aliasing"). A step that
        # also emits its new carry as a per-step output (DKVMN's memory, for the mastery output) would do
        # exactly that, so that one output is returned as a copy. Other outputs are fresh tensors already.
        return new_state, tuple(output.clone() if output is new_state else output for output in outputs_t)

    final, outputs = scan(body, carry, tuple(t.transpose(0, 1) for t in inputs))
    return final, tuple(output.transpose(0, 1) for output in outputs)
