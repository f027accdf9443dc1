"""Group-wise int4 linear layers: a target computed with the weights as a Q4_1 GGUF stores them.

A Q4_1 block holds 32 weights of one row as 4-bit codes ``q`` with one f16 scale ``d`` and one
f16 minimum ``m``: ``w = q * d + m``. A model converted from such a file (`smollm2`) holds those
values in float32, so the codes, scales and minima can be read back from the dense weights
exactly (`recover_q4_1` checks that every weight comes back bit for bit, and refuses otherwise).
`Q4Linear` then multiplies with torch's CPU int4 weight-only kernel
(``_weight_int4pack_mm_for_cpu``), which reads a sixth of the float32 bytes: the scales and the
activations enter the kernel in bfloat16, so a q4 target's logits differ from the float32
model's in the low bits, and its greedy tokens may differ (a different target, never called
lossless against float32).

Rounding into bfloat16 at every linear magnifies any difference in the stream before it: a
float32 stream differs in its last bits between a 1-row and a 5-row forward (the products and
the attention are not row-invariant), and about one bfloat16 rounding in 2^15 then flips, enough
to change a greedy token now and then. So a q4 target keeps its stream (embeddings, norms,
attention, residuals) in float64, where those differences never reach a bfloat16 boundary; the
int4 kernel is row-invariant itself. Then a speculative run equals the same q4 target's own greedy
decoding, at any batch.

The output layer of such a file is Q8_0 (blocks of 32 int8 codes ``c`` in -127..127 with one f16
scale ``d``: ``w = c * d``). `recover_q8_0` reads those codes back exactly too, and `Q8Linear`
computes with them through the same int4 kernel as two halves: ``c = 16 h + l`` with ``h`` in
-8..7 and ``l`` in 0..15, so ``w = (16 d) h + d l``, each half a group-wise int4 matrix. That reads
a quarter of the float32 bytes (about 3.5 against 11 ms a token for SmolLM2's 49,152 x 576 output on
one core); an output layer that is not Q8_0 stays a `Float32Linear`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

__all__ = ["GROUP", "WEIGHTS", "Float32Linear", "Q4Linear", "Q8Linear", "compute_as_q4", "quantize_linears",
           "recover_q4_1", "recover_q8_0", "weight_format"]

logger = logging.getLogger(__name__)

GROUP = 32  # weights per Q4_1 block (and the kernel's group size)
WEIGHTS = ("dense", "q4")  # how a target's linear layers hold their weights


def recover_q4_1(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [N, K] int32 in 0..15, scales [N, K/32], minima [N, K/32]) of a dense ``weight``
    [N, K] that a Q4_1 dequantization produced; ValueError when a weight does not come back
    exactly (the tensor was not Q4_1, or was changed since)."""
    if weight.dim() != 2 or weight.shape[1] % GROUP:
        raise ValueError(f"weight shape {tuple(weight.shape)}: must be [N, K] with K a multiple of {GROUP}")
    w = weight.detach().float()
    n, k = w.shape
    g = w.view(n, k // GROUP, GROUP)
    lo = g.amin(-1)
    scale = ((g.amax(-1) - lo) / 15).half().float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((g - lo[..., None]) / safe[..., None]).round().clamp(0, 15)
    back = codes * scale[..., None] + lo[..., None]
    if not torch.equal(back, g):
        bad = int((back != g).sum())
        raise ValueError(f"weight shape {tuple(weight.shape)}: {bad} values are not q * d + m of a Q4_1 block "
                         f"(not a Q4_1 tensor); refusing to quantize it")
    return codes.to(torch.int32).view(n, k), scale, lo


def recover_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [N, K] int32 in -127..127, scales [N, K/32]) of a dense ``weight`` [N, K] that a
    Q8_0 dequantization produced (``d`` = the block's largest magnitude / 127, rounded to f16);
    ValueError when a weight does not come back exactly."""
    if weight.dim() != 2 or weight.shape[1] % GROUP:
        raise ValueError(f"weight shape {tuple(weight.shape)}: must be [N, K] with K a multiple of {GROUP}")
    w = weight.detach().float()
    n, k = w.shape
    g = w.view(n, k // GROUP, GROUP)
    scale = (g.abs().amax(-1) / 127).half().float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = (g / safe[..., None]).round().clamp(-127, 127)
    if not torch.equal(codes * scale[..., None], g):
        bad = int((codes * scale[..., None] != g).sum())
        raise ValueError(f"weight shape {tuple(weight.shape)}: {bad} values are not c * d of a Q8_0 block "
                         f"(not a Q8_0 tensor); refusing to quantize it")
    return codes.to(torch.int32).view(n, k), scale


class Q4Linear(nn.Module):
    """``y = x @ W.T (+ b)`` with ``W`` as packed int4 codes and bfloat16 scale / zero pairs.

    ``x`` [..., K] in any float dtype; ``y`` [..., N] in ``x``'s dtype. CPU only (the packed
    layout is the CPU kernel's)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        n, k = codes.shape
        self.in_features, self.out_features = k, n
        pad = -n % 16  # the packed layout wants rows in sixteens: padded rows (scale 0) are cut off
        if pad:
            codes, scale, minimum = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (codes, scale, minimum))
        # the kernel dequantizes (q - 8) * scale + zero: zero = m + 8 d
        pairs = torch.stack([scale, minimum + 8 * scale], -1).transpose(0, 1).contiguous()
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1))  # noqa: SLF001
        self.register_buffer("scale_zero", pairs.to(torch.bfloat16))  # [K/32, N, 2]
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scale_zero)  # noqa: SLF001
        y = y[:, :self.out_features].to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}, int4"


class Q8Linear(nn.Module):
    """``y = x @ W.T`` with ``W`` as Q8_0 codes and scales, computed as two `Q4Linear` halves
    (module docstring): ``x`` [..., K], ``y`` [..., N] in ``x``'s dtype; CPU only. ``weight``:
    the dense tensor the codes came from, kept by reference (not saved, no copy) for a draft that
    shares the target's output layer (an EAGLE-1 head)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        super().__init__()
        if weight is not None:
            self.register_buffer("weight", weight.detach(), persistent=False)
        high = torch.div(codes, 16, rounding_mode="floor")  # -8..7
        self.high = Q4Linear(high + 8, 16 * scale, -128 * scale)  # (h + 8) * 16 d - 128 d = 16 d h
        self.low = Q4Linear(codes - 16 * high, scale, torch.zeros_like(scale))  # l * d
        self.out_features, self.in_features = codes.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.high(x) + self.low(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q8_0 as two int4 halves"


class Float32Linear(nn.Module):
    """``y = x @ W.T`` with ``W`` kept in float32 and ``x`` rounded to float32 on the way in;
    ``y`` in ``x``'s dtype (a q4 target's output layer: half the bytes of a float64 one)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().to(torch.float32).clone())
        self.out_features, self.in_features = self.weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.to(torch.float32), self.weight).to(x.dtype)


def quantize_linears(module: nn.Module, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every `nn.Linear` under ``module`` (but those named in ``skip``) whose weight is a
    Q4_1 dequantization by a `Q4Linear`; returns how many. ValueError (nothing replaced) when a
    linear's weight is not Q4_1."""
    found = [(name, m) for name, m in module.named_modules()
             if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] not in skip]
    built = [(name, Q4Linear(*recover_q4_1(m.weight), bias=m.bias)) for name, m in found]
    for name, q in built:
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, child, q)
    logger.info("%d linear layers computed from their Q4_1 codes", len(built))
    return len(built)


def weight_format(module: nn.Module) -> str:
    """"q4" when any linear under ``module`` is a `Q4Linear`, else "dense" (part of a target's
    identity: graphs and compiled code of one never serve the other)."""
    return "q4" if any(isinstance(m, Q4Linear) for m in module.modules()) else "dense"


def compute_as_q4(model: nn.Module) -> nn.Module:
    """A transformers ``*ForCausalLM`` (loaded in float64) computed as a q4 target: its decoder
    linears from their Q4_1 codes, its output layer a `Q8Linear` when it is Q8_0, else a
    `Float32Linear`; returns ``model``."""
    if model.dtype != torch.float64:
        raise ValueError(f"dtype={model.dtype}: a q4 target keeps its stream in float64 (module docstring)")
    quantize_linears(model)
    weight = model.get_output_embeddings().weight
    try:
        output: nn.Module = Q8Linear(*recover_q8_0(weight), weight=weight)
    except ValueError as e:
        logger.info("output layer kept in float32: %s", e)
        output = Float32Linear(weight)
    model.set_output_embeddings(output)
    return model
