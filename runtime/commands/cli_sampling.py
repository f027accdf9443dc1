"""The sampling flags of ``draftgraph generate`` and ``simulate``.

``--seed`` (or ``--sampling-seed``) is the request's seed; without it a sampled run draws one and
prints it (replay it with the flag). The toy models' training seed is ``--model-seed``."""

from __future__ import annotations

import argparse
import random

from draftgraph.runtime.sampling import SamplingParams
from draftgraph.runtime.sampling.params import MAX_SEED

__all__ = ["add_sampling_flags", "sampling_from"]


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """--temperature (0: greedy, the default) --top-p --top-k --min-p --seed (--sampling-seed)."""
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sample")
    p.add_argument("--top-p", type=float, default=1.0, help="keep the smallest set holding this mass (1: all)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--min-p", type=float, default=0.0, help="keep tokens >= min_p x the most likely (0: all)")
    p.add_argument("--seed", "--sampling-seed", dest="sampling_seed", type=int, default=None,
                   help="the request's seed (the same seed: the same text, with or without speculation; "
                        "simulate: request i draws with seed + i)")


def sampling_from(ns: argparse.Namespace) -> SamplingParams | None:
    """The flags' `SamplingParams` (ValueError naming the field), None when greedy; a sampled
    run without --seed gets a random one (the caller shows it)."""
    if ns.temperature == 0 and (ns.top_p, ns.top_k, ns.min_p) == (1.0, 0, 0.0):
        return None
    seed = ns.sampling_seed if ns.sampling_seed is not None else random.SystemRandom().randint(0, MAX_SEED)
    params = SamplingParams(ns.temperature, ns.top_p, ns.top_k, ns.min_p, seed)
    if params.greedy:
        raise ValueError(f"--top-p/--top-k/--min-p with --temperature={ns.temperature}: the filters apply to "
                         f"sampling; give a temperature > 0")
    return params
