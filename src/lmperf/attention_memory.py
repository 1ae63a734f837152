"""The memory model of plain attention, softmax(Q K^T / sqrt(d)) V in PyTorch ops: what a
forward and backward hold at their peak, and what eager attention keeps between them. Read by
the PyTorch-attention benchmark (its predicted columns) and by the report (the out-of-memory
edge against the GPU's memory)."""
from __future__ import annotations

ELEMENT_BYTES = {"fp32": 4, "bf16": 2}
# The N x N tensors the forward and backward of each implementation hold at once at their peak,
# as the memory model counts them: eager's softmax backward holds P, its gradient and their
# product; a forward holds the scores and P. torch.compile's graph fuses the softmax's backward
# (P and its gradient).
PEAK_SQUARES = {"eager": 3, "compiled": 2}


def predicted_peak_bytes(impl: str, batch: int, seq_len: int, d: int, element_bytes: int = 4) -> int:
    """The memory model's peak of one forward and backward: the N x N tensors held at once
    (PEAK_SQUARES; 3 for an implementation it does not know) and the B x N x d ones (Q, K, V,
    the output, the upstream gradient and Q's, K's and V's gradients)."""
    squares = PEAK_SQUARES.get(impl, 3)
    return element_bytes * (squares * batch * seq_len * seq_len + 8 * batch * seq_len * d)


def predicted_saved_bytes(batch: int, seq_len: int, d: int, element_bytes: int = 4) -> int:
    """What eager attention holds between forward and backward, beyond nothing: q, k, v and the
    output (B x N x d each) and the softmax output P (B x N x N), which softmax's and PV's
    backward both need. The scaled scores are freed: softmax's backward uses its output."""
    return element_bytes * (4 * batch * seq_len * d + batch * seq_len * seq_len)
