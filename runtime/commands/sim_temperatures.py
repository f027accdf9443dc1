"""``simulate --temperatures 0,0.7,1.0``: the same workload served once per temperature, its
acceptance and tokens/s side by side (the draft is the argmax, so a draw matches it less often
than the argmax does: docs/sampling.md).

Each run keeps the command's other sampling flags (top-p, top-k, min-p, seed; request i draws
with seed + i) and its plain baseline (greedy decoding at T = 0, the plain sampled run above),
so each row also says whether the speculative run emitted the plain run's tokens. The
eager-backend baseline is left out of these runs (it would double their time).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ..sampling import SamplingParams
from .simulate import SimulationConfig

__all__ = ["parse_temperatures", "temperature_rows", "temperature_lines"]

MAX_TEMPERATURES = 4  # each one is a whole run of the workload


def parse_temperatures(text: str) -> tuple[float, ...]:
    """Comma-separated temperatures (each 0..2, at most `MAX_TEMPERATURES`, no repeat);
    ValueError naming the flag, the value and the rule."""
    try:
        temps = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--temperatures={text!r}: must be comma-separated numbers, e.g. 0,0.7,1.0") from None
    if not temps or len(temps) > MAX_TEMPERATURES:
        raise ValueError(f"--temperatures={text!r}: give 1 to {MAX_TEMPERATURES} temperatures (one run each)")
    bad = [t for t in temps if not (math.isfinite(t) and 0.0 <= t <= 2.0)]
    if bad:
        raise ValueError(f"--temperatures={text!r}: {bad[0]} is not in [0, 2]")
    if len(set(temps)) != len(temps):
        raise ValueError(f"--temperatures={text!r}: a temperature is repeated")
    return temps


def _config_at(cfg: SimulationConfig, temperature: float, seed: int) -> SimulationConfig:
    """``cfg`` at ``temperature`` (0: greedy), its filters and seed kept (``seed`` when it
    samples nothing itself), quiet, no eager baseline, no profile."""
    base = cfg.sampling
    if temperature == 0:
        sampling = None
    elif base is None:
        sampling = SamplingParams(temperature, seed=seed)
    else:
        sampling = dataclasses.replace(base, temperature=temperature)
    return dataclasses.replace(cfg, sampling=sampling, progress=False, eager_baseline=False, profile_dir=None,
                               profile_steps=None, profile_spans_only=False)


def _row(temperature: float, report: dict[str, Any]) -> dict[str, Any]:
    return {"temperature": temperature, "accept_length_mean": report["accept_length_mean"],
            "tokens_per_s": report["tokens_per_s"], "plain_tokens_per_s": report.get("greedy_tokens_per_s"),
            "speedup": report.get("speedup"), "identical_to_plain": report.get("lossless")}


def temperature_rows(cfg: SimulationConfig, temps: tuple[float, ...], seed: int,
                     run: Callable[[SimulationConfig], dict[str, Any]], served: dict[str, Any] | None = None
                     ) -> list[dict[str, Any]]:
    """One row per temperature: ``run`` (`run_simulation`) of ``cfg`` at that temperature, with
    ``seed`` where ``cfg`` samples nothing. ``served``: the report of ``cfg`` itself, used for
    its own temperature instead of a run."""
    own = cfg.sampling.temperature if cfg.sampling is not None else 0.0
    return [_row(t, served if served is not None and t == own else run(_config_at(cfg, t, seed))) for t in temps]


def temperature_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as an aligned table (plain: greedy decoding at T = 0, plain sampling above)."""
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    head = ("T", "accept length", "tokens/s", "plain tokens/s", "speedup", "identical to plain")
    body = [(num(r["temperature"], "g"), num(r["accept_length_mean"], ".2f"), num(r["tokens_per_s"], ".1f"),
             num(r["plain_tokens_per_s"], ".1f"), num(r["speedup"], ".2f") + ("x" if r["speedup"] else ""),
             str(r["identical_to_plain"])) for r in rows]
    widths = [max(len(c[i]) for c in (head, *body)) for i in range(len(head))]
    return ["  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in (head, *body)]
