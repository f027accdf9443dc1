"""Draft weights that change under live graphs: checked, copied in place at a step boundary.

A captured graph reads the draft model's parameters at the addresses they had at capture (a CUDA
graph by pointer; the trace and compile backends by the tensor objects they recorded). Copying
new values *into* those tensors keeps every graph valid with no recapture; replacing a tensor
(``load_state_dict(assign=True)``, ``module.weight = nn.Parameter(...)``) leaves the graphs
reading the old storage: on CUDA that is a read of freed memory, elsewhere silently stale
weights. So:

- `WeightRefit` checks a state dict completely first (keys, shapes, dtypes, devices, layouts,
  finite values of a magnitude the draft can compute with; nothing changes on an error),
  records it (one reference write: safe from another thread or a signal handler) and copies it
  in place when its owner reaches a step boundary; each update bumps a version.
- `StorageGuard` records the storage of the tensors a graph reads at capture, and refuses a
  replay after one was replaced, naming it (`StaleWeightsError`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from draftgraph.runtime.validation import ConfigTypeError

__all__ = ["MAX_ABS_WEIGHT", "StaleWeightsError", "StorageGuard", "WeightRefit", "check_state_dict"]

logger = logging.getLogger(__name__)

MAX_ABS_WEIGHT = 1e4
"""The largest |value| `check_state_dict` accepts in a floating tensor (and at most the square
root of its dtype's largest value: 256 for float16). A trained draft's weights are a few units
at most; a finite 1e38 passes an isfinite check, yet a single product overflows, and the
draft's carried state (its KV cache) then fills with inf / NaN."""

class StaleWeightsError(RuntimeError):
    """A captured graph would read a draft tensor that was replaced since its capture."""


def _tensors(module: Any) -> dict[str, torch.Tensor]:
    """Parameters and buffers of ``module`` by name (none for a callable that is not a Module)."""
    if not isinstance(module, torch.nn.Module):
        return {}
    out = dict(module.named_parameters())
    out.update(module.named_buffers())
    return out


class StorageGuard:
    """The storage of every parameter and buffer of a module at capture time; `check` (a dict
    lookup and a pointer read per tensor, a few µs) refuses when one was replaced since."""

    __slots__ = ("_entries",)

    def __init__(self, module: Any) -> None:
        entries = []
        if isinstance(module, torch.nn.Module):
            for prefix, mod in module.named_modules():
                for table in (mod._parameters, mod._buffers):  # noqa: SLF001  # torch's own tables
                    for key, t in table.items():
                        if t is not None:
                            name = f"{prefix}.{key}" if prefix else key
                            entries.append((name, table, key, t.data_ptr()))
        self._entries = tuple(entries)

    def check(self) -> None:
        """Raise `StaleWeightsError` naming the first tensor whose storage moved."""
        for name, table, key, ptr in self._entries:
            t = table.get(key)
            if t is None or t.data_ptr() != ptr:
                what = "was removed" if t is None else "was replaced (new storage)"
                raise StaleWeightsError(
                    f"draft parameter {name!r} {what} since the graphs were captured, and they "
                    f"would read the old storage: change draft weights with update_draft_weights "
                    f"(copied in place), or reload to capture again")


def check_state_dict(module: torch.nn.Module, state_dict: Mapping[str, Any], strict: bool = True,
                     max_abs: float = MAX_ABS_WEIGHT) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Check every entry of ``state_dict`` against ``module``'s tensors before anything changes:
    (name, destination, value) for each entry to copy. TypeError for a value that is not a
    dense (strided) tensor or has another dtype; ValueError for a missing or unknown key
    (``strict``), no key of the draft at all (``strict=False``: a state dict of another model),
    another shape, another device, a NaN / inf, or a magnitude above ``max_abs`` (see
    `MAX_ABS_WEIGHT`)."""
    if not isinstance(state_dict, Mapping):
        raise ConfigTypeError(f"state_dict={type(state_dict).__name__}: must be a mapping of name to tensor")
    own = _tensors(module)
    persistent = set(module.state_dict().keys())
    unknown = sorted(k for k in state_dict if k not in persistent)
    missing = sorted(persistent - set(state_dict))
    if strict and (unknown or missing):
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unknown:
            parts.append(f"unknown keys {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        raise ValueError(f"state_dict: {'; '.join(parts)} (strict=True: the keys must be the draft's "
                         f"{len(persistent)} keys; strict=False updates a subset)")
    if len(unknown) == len(state_dict):
        expected = sorted(persistent)
        raise ValueError(f"state_dict: none of its {len(state_dict)} keys is the draft's (e.g. {unknown[:3]}); "
                         f"the draft expects keys such as {expected[:5]}{' ...' if len(expected) > 5 else ''} "
                         f"(a state dict of another model?): refused, the version is unchanged")
    if unknown:
        logger.warning("update_draft_weights(strict=False): ignoring keys the draft does not have: %s",
                       unknown[:10])
    pairs = []
    for name, value in state_dict.items():
        if name not in persistent:
            continue
        dest = own[name]
        if not isinstance(value, torch.Tensor):
            raise ConfigTypeError(f"state_dict[{name!r}]={type(value).__name__}: must be a tensor")
        if value.layout != torch.strided or value.is_quantized:
            kind = "quantized" if value.is_quantized else str(value.layout)
            raise ConfigTypeError(f"state_dict[{name!r}] is a {kind} tensor: must be a dense (strided) tensor "
                                  f"like the draft's (e.g. value.to_dense())")
        if value.shape != dest.shape:
            raise ValueError(f"state_dict[{name!r}] has shape {tuple(value.shape)}: the draft's is "
                             f"{tuple(dest.shape)}")
        if value.dtype != dest.dtype:
            raise ConfigTypeError(f"state_dict[{name!r}] has dtype {value.dtype}: the draft's is {dest.dtype}")
        if value.device != dest.device:
            raise ValueError(f"state_dict[{name!r}] is on {value.device}: the draft's is on {dest.device}")
        value = value.detach().clone()  # the caller may reuse its tensors once this returns
        if value.is_floating_point() and value.numel():
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"state_dict[{name!r}] holds NaN or inf values: refused")
            limit = min(max_abs, torch.finfo(value.dtype).max ** 0.5)
            peak = float(value.abs().max())
            if peak > limit:
                raise ValueError(f"state_dict[{name!r}] holds a value of magnitude {peak:.3g}: above {limit:.3g}, "
                                 f"the largest the draft computes with (its activations would overflow): refused")
        pairs.append((name, dest, value))
    return pairs


class WeightRefit:
    """In-place draft weight updates of one module, applied at its owner's step boundary.

    `request` checks and records (the latest request supersedes one not yet applied);
    `apply_pending` copies it in place and bumps `version`. Counts: `updates`, `superseded`,
    and `updated_at` (Unix time of the last update applied, None before any)."""

    def __init__(self, module: torch.nn.Module) -> None:
        if not isinstance(module, torch.nn.Module):
            raise ConfigTypeError(f"module={type(module).__name__}: must be a torch.nn.Module")
        self.module = module
        self.version = 0
        self.updates = 0
        self.superseded = 0
        self.updated_at: float | None = None
        self.last_copy_s = 0.0
        self._pending: list[tuple[str, torch.Tensor, torch.Tensor]] | None = None

    @property
    def pending(self) -> bool:
        """True when an update waits for the next step boundary."""
        return self._pending is not None

    def request(self, state_dict: Mapping[str, Any], strict: bool = True) -> int:
        """Check ``state_dict`` (nothing changes on an error) and record it for the next step
        boundary; returns the version the draft will have once it is applied."""
        pairs = check_state_dict(self.module, state_dict, strict)
        if self._pending is not None:
            self.superseded += 1
        self._pending = pairs
        return self.version + 1

    def apply_pending(self) -> bool:
        """Copy a recorded update into the module's tensors (their storage does not move);
        False when there was none. Call at a step boundary, under the owner's lock."""
        pairs, self._pending = self._pending, None
        if pairs is None:
            return False
        start = time.perf_counter()
        with torch.no_grad():
            for _, dest, value in pairs:
                dest.copy_(value)
        self.last_copy_s = time.perf_counter() - start
        self.version += 1
        self.updates += 1
        self.updated_at = time.time()
        logger.info("draft weights updated in place: version %d, %d tensors, %.2f ms", self.version,
                    len(pairs), self.last_copy_s * 1e3)
        return True

    def as_dict(self) -> dict[str, Any]:
        """version, updates, superseded, pending, updated_at (Unix time), last_copy_s."""
        return {"version": self.version, "updates": self.updates, "superseded": self.superseded,
                "pending": self.pending, "updated_at": self.updated_at, "last_copy_s": self.last_copy_s}
