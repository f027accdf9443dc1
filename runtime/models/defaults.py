"""`default_models`: the embedded target and drafts, trained at first use and cached.

Cache: ``$DRAFTGRAPH_CACHE`` or ``~/.cache/draftgraph``, one file per (model shapes, training
plan, seed, corpus digest). Training shows a progress bar and takes a few minutes on 2 cores;
later calls load the file. A damaged file (a copy cut short, a full disk) is reported by name,
deleted and trained again. Inference runs the target in float64 (so a batched tree verify and
one-token decoding pick the same argmax: rounding differences are ~1e-16, far below any gap
between logits) and the drafts in float32 (a draft's rounding cannot change what is accepted).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from functools import lru_cache
from pathlib import Path

import torch

from .corpus import load_corpus
from .eagle_head import EagleConfig, EagleDraftHead
from .multi_layer import MultiLayerConfig, MultiLayerDraft
from .target import TargetConfig, TargetModel
from .training import TrainPlan, distill_data, train_eagle, train_multi_layer, train_target

__all__ = ["default_models", "model_cache_dir", "DRAFT_KINDS"]

logger = logging.getLogger(__name__)

DRAFT_KINDS = ("eagle", "multi_layer")
FORMAT_VERSION = 1


def model_cache_dir() -> Path:
    """Where trained weights live: $DRAFTGRAPH_CACHE or ~/.cache/draftgraph."""
    env = os.environ.get("DRAFTGRAPH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "draftgraph"


def _cache_key(seed: int, plan: TrainPlan, digest: str) -> str:
    spec = {"v": FORMAT_VERSION, "seed": seed, "plan": plan.__dict__, "corpus": digest,
            "target": TargetConfig().as_dict(), "eagle": EagleConfig().as_dict(),
            "multi_layer": MultiLayerConfig().as_dict()}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: Path):
    """Serialize first-use training across processes (pytest, the CLI) on one machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _progress_bar(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; stay usable without it
        return contextlib.nullcontext(None)
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


def _train_all(seed: int, plan: TrainPlan) -> dict[str, dict[str, torch.Tensor]]:
    """Train the target, then distill both drafts; float32 state dicts."""
    corpus = load_corpus()
    start = time.perf_counter()
    target = TargetModel(TargetConfig(), seed=seed)
    with _progress_bar(plan.total_steps, "draftgraph: training the default models (first use)") as bar:
        tick = bar.update if bar is not None else (lambda n: None)
        loss_t = train_target(target, corpus.train, plan, seed, tick)
        data = distill_data(target, corpus.train, plan, seed)
        tick(1)
        eagle = EagleDraftHead(target, seed=seed)
        loss_e = train_eagle(eagle, data, plan, seed, tick)
        multi = MultiLayerDraft(target, seed=seed)
        loss_m = train_multi_layer(multi, data, plan, seed, tick)
    logger.info("trained default models in %.0f s (losses: target %.3f, eagle %.3f, multi-layer %.3f)",
                time.perf_counter() - start, loss_t, loss_e, loss_m)
    return {"target": target.state_dict(), "eagle": eagle.state_dict(),
            "multi_layer": multi.state_dict(),
            "meta": {"losses": torch.tensor([loss_t, loss_e, loss_m]),
                     "train_s": torch.tensor(time.perf_counter() - start)}}


def _load_cached(path: Path) -> dict[str, dict[str, torch.Tensor]] | None:
    """The weights in ``path``, or None after deleting a damaged file (the caller trains again).

    A file that cannot be deleted is an OSError that names it and says to delete it by hand.
    """
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError:
        raise
    except Exception as exc:  # truncated or garbled: RuntimeError (zip), EOFError, OSError, UnpicklingError
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0][:160] if lines else 'no details'}"
    else:
        missing = [k for k in ("target", *DRAFT_KINDS) if not isinstance(weights, dict) or k not in weights]
        if not missing:
            return weights
        reason = f"no {', '.join(missing)} weights in it"
    logger.warning("model cache file %s is damaged (%s); deleting it and training again", path, reason)
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise OSError(f"model cache file {path} is damaged ({reason}) and could not be deleted ({exc}); "
                      f"delete it by hand and the models are trained again at next use") from exc
    return None


@lru_cache(maxsize=4)
def _weights(seed: int, plan: TrainPlan) -> dict[str, dict[str, torch.Tensor]]:
    key = _cache_key(seed, plan, load_corpus().digest)
    folder = model_cache_dir()
    path = folder / f"models-{key}.pt"
    with _file_lock(folder / f"models-{key}.lock"):
        if path.exists():
            cached = _load_cached(path)
            if cached is not None:
                return cached
        weights = _train_all(seed, plan)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(weights, tmp)
        os.replace(tmp, path)
        logger.info("cached the default models in %s", path)
        return weights


def default_models(seed: int = 0, draft: str = "eagle", device: str | torch.device = "cpu",
                   plan: TrainPlan | None = None) -> tuple[TargetModel, torch.nn.Module]:
    """(target, draft): the target in float64 and ``draft`` ("eagle": `EagleDraftHead`,
    "multi_layer": `MultiLayerDraft`) in float32; fresh module instances on every call."""
    if draft not in DRAFT_KINDS:
        raise ValueError(f"draft={draft!r}: must be one of {list(DRAFT_KINDS)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed={seed!r}: must be an int")
    weights = _weights(seed, plan or TrainPlan())
    target = TargetModel(TargetConfig(), seed=seed)
    target.load_state_dict(weights["target"])
    target = target.double().to(device).eval().requires_grad_(False)
    if draft == "eagle":
        model: torch.nn.Module = EagleDraftHead(target, seed=seed)
    else:
        model = MultiLayerDraft(target, seed=seed)
    model.load_state_dict(weights[draft])
    model = model.to(device).eval().requires_grad_(False)
    return target, model
