"""`default_models`: the embedded target and drafts, trained at first use, cached, written as
checkpoints (`default_checkpoints`: the target with ``save_pretrained``, the EAGLE-3 head in its
published layout) and loaded back through `load_models`, the path a user's checkpoint takes.

Cache: ``$DRAFTGRAPH_CACHE`` or ``~/.cache/draftgraph``, one file per (model shapes, training
plan, seed, corpus digest). Training shows a progress bar and takes a few minutes on 2 cores;
later calls load the file. Each file has a SHA-256 digest beside it (``.pt.sha256``), checked on
every load: a damaged file (a copy cut short, a full disk, flipped bytes) is reported by name,
deleted and trained again. A file from before digests is accepted and its digest written once.
A folder holding valid weights is read without writing anything (no lock, no temp file); an
unwritable folder without them falls back to a per-user temporary folder, with one warning.
A save removes this key's ``.tmp*`` files left by an interrupted save (under the lock).

On a shared host (`draftgraph.runtime.private_dir`): the fallback folder is created 0700 and
refused (an `UnsafeFolderError` naming it, nothing loaded from it) unless it is a real
directory owned by this user and not writable by group or others; in every cache folder the
lock is opened without truncating and without following a symlink, temporary files are created
``O_EXCL | O_NOFOLLOW`` under random names, and a ``.pt`` that is not a regular file (a FIFO, a
symlink to a device) is treated as damaged before a byte is read from it. An empty or
unreadable ``.sha256`` is a missing digest (the file is checked by loading it, and the digest
written again), not a mismatch that deletes valid weights.
Inference runs the target in float64 (so a batched tree verify and
one-token decoding pick the same argmax: rounding differences are ~1e-16, far below any gap
between logits), the EAGLE-3 head in the target's dtype and the multi-layer draft in float32 (a
draft's rounding cannot change what is accepted).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import torch

from draftgraph.graphs.core.settings import cache_root

from ..private_dir import UnsafeFolderError, create_exclusive, open_lock, private_dir, read_regular
from .corpus import load_corpus
from .default_spec import DRAFT_VOCAB, EAGLE3_LAYER_IDS, MAX_LEN, head_config, spec_dict, target_config
from .eagle_heads import Eagle3Head
from .hf_load import load_target
from .hf_models import load_models
from .hf_target import HFTarget
from .multi_layer import MultiLayerConfig, MultiLayerDraft
from .training import (
    TrainPlan,
    distill_data,
    draft_vocabulary,
    init_eagle3,
    train_eagle,
    train_multi_layer,
    train_target,
)

__all__ = ["default_checkpoints", "default_models", "model_cache_dir", "DRAFT_KINDS"]

logger = logging.getLogger(__name__)

DRAFT_KINDS = ("eagle", "multi_layer")
FORMAT_VERSION = 2  # 2: a transformers Llama target and a published EAGLE-3 head
MAX_WEIGHTS_BYTES = 1 << 30  # a cache file larger than this is not read (the default models: ~18 MB)
_DIGEST_BYTES = 4096
_HEX64 = re.compile(r"[0-9a-f]{64}")


def model_cache_dir() -> Path:
    """Where trained weights live: $DRAFTGRAPH_CACHE or ~/.cache/draftgraph."""
    return cache_root(expand=False)


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _writable(folder: Path) -> bool:
    """Whether ``folder`` exists (or can be made) and this process may create files in it."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def _fallback_dir() -> Path:
    """A per-user folder under the system's temporary folder (checked by `private_dir` before use)."""
    uid = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return Path(tempfile.gettempdir()) / f"draftgraph-{uid}"


def _cache_key(seed: int, plan: TrainPlan, digest: str) -> str:
    spec = {"v": FORMAT_VERSION, "seed": seed, "plan": plan.__dict__, "corpus": digest, "models": spec_dict(),
            "multi_layer": MultiLayerConfig().as_dict()}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: Path):
    """Serialize first-use training across processes (pytest, the CLI) on one machine. The lock
    file is never truncated nor opened through a symlink (`open_lock`)."""
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _progress_bar(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; stay usable without it
        return contextlib.nullcontext(None)
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


def _train_all(seed: int, plan: TrainPlan) -> dict[str, dict[str, torch.Tensor]]:
    """Train the target, then distill both drafts; float32 state dicts (the target's and the
    head's under their transformers / published key names)."""
    from transformers import LlamaForCausalLM

    corpus = load_corpus()
    start = time.perf_counter()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(target_config())
    model.set_attn_implementation("sdpa")
    with _progress_bar(plan.total_steps, "draftgraph: training the default models (first use)") as bar:
        tick = bar.update if bar is not None else (lambda n: None)
        loss_t = train_target(model, corpus.train, plan, seed, tick)
        target_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        target = HFTarget(model, MAX_LEN, feature_layers=_eagle3_streams())
        data = distill_data(target, corpus.train, plan, seed)
        tick(1)
        torch.manual_seed(seed + 1)
        eagle = Eagle3Head(head_config(), target, draft_vocab_size=DRAFT_VOCAB, biased=frozenset())
        init_eagle3(eagle, target, draft_vocabulary(data, DRAFT_VOCAB))
        loss_e = train_eagle(eagle, data, plan, seed, tick)
        multi = MultiLayerDraft(target, seed=seed)
        loss_m = train_multi_layer(multi, data, plan, seed, tick)
    logger.info("trained default models in %.0f s (losses: target %.3f, eagle-3 %.3f, multi-layer %.3f)",
                time.perf_counter() - start, loss_t, loss_e, loss_m)
    return {"target": target_state, "eagle": {k: v.detach().clone() for k, v in eagle.state_dict().items()},
            "multi_layer": multi.state_dict(),
            "meta": {"losses": torch.tensor([loss_t, loss_e, loss_m]),
                     "train_s": torch.tensor(time.perf_counter() - start)}}


def _eagle3_streams() -> tuple[int, ...]:
    """The residual streams the default head reads (entering layer id + 1)."""
    return tuple(i + 1 for i in EAGLE3_LAYER_IDS)


def _load_cached(path: Path) -> dict[str, dict[str, torch.Tensor]] | None:
    """The weights in ``path``, or None after deleting a damaged file (the caller trains again).

    A file that cannot be deleted is an OSError that names it and says to delete it by hand.
    """
    digest_file = _digest_path(path)
    expected = _read_digest(digest_file)
    try:
        try:
            raw = read_regular(path, MAX_WEIGHTS_BYTES, "model cache file", follow_symlinks=True)
        except UnsafeFolderError:  # a FIFO, a device: refused before a byte is read
            raise ValueError("not a regular file") from None
        actual = hashlib.sha256(raw).hexdigest()
        weights = None if expected is not None and actual != expected else \
            torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except PermissionError:
        raise
    except Exception as exc:  # truncated or garbled: RuntimeError (zip), EOFError, OSError, UnpicklingError
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0][:160] if lines else 'no details'}"
    else:
        if weights is None:
            reason = f"content digest {str(actual)[:12]}... does not match {digest_file.name} ({expected[:12]}...)"
        else:
            missing = [k for k in ("target", *DRAFT_KINDS) if not isinstance(weights, dict) or k not in weights]
            if not missing:
                if expected is None:  # written before digests (or an empty one): record its digest
                    _write_digest(path, actual)
                return weights
            reason = f"no {', '.join(missing)} weights in it"
    logger.warning("model cache file %s is damaged (%s); deleting it and training again", path, reason)
    try:
        path.unlink(missing_ok=True)
        digest_file.unlink(missing_ok=True)
    except OSError as exc:
        raise OSError(f"model cache file {path} is damaged ({reason}) and could not be deleted ({exc}); "
                      f"delete it by hand and the models are trained again at next use") from exc
    return None


def _read_digest(digest_file: Path) -> str | None:
    """The digest recorded in ``digest_file``; None when there is none to trust: missing, empty,
    unreadable, not a regular file, or not 64 hex digits (then the weights are checked by loading
    them and the digest is written again; deleting valid weights over it would be wrong)."""
    try:
        text = read_regular(digest_file, _DIGEST_BYTES, "digest file").decode("ascii")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        logger.warning("digest file %s is unreadable (%s); checking the weights by loading them",
                       digest_file, str(exc)[:200])
        return None
    words = text.split()
    if not words or not _HEX64.fullmatch(words[0]):
        logger.warning("digest file %s holds no digest; checking the weights by loading them", digest_file)
        return None
    return words[0]


def _write_new(folder: Path, prefix: str, data: bytes) -> Path:
    """A new file in ``folder`` holding ``data``, created ``O_EXCL | O_NOFOLLOW`` (`create_exclusive`)."""
    fd, tmp = create_exclusive(folder, prefix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def _write_digest(path: Path, digest: str) -> None:
    """Record ``digest`` beside ``path``; a folder that refuses is logged, not fatal (read-only use)."""
    digest_file = _digest_path(path)
    tmp: Path | None = None
    try:
        tmp = _write_new(path.parent, f"{digest_file.name}.tmp", (digest + "\n").encode())
        os.replace(tmp, digest_file)
    except OSError as exc:
        logger.info("could not record the digest of %s (%s); it is checked for completeness only", path, exc)
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    else:
        logger.info("recorded the digest of %s (written before digests) in %s", path, digest_file.name)


def _remove_stale_tmp(folder: Path, key: str) -> None:
    """Delete ``models-<key>.*tmp<pid>`` files: under the key's lock no other save of it is running."""
    for stale in [*folder.glob(f"models-{key}.tmp*"), *folder.glob(f"models-{key}.pt.sha256.tmp*")]:
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            logger.info("removed %s, left by an interrupted save", stale)


def _save(weights: dict, path: Path, key: str) -> None:
    """Write ``path`` and its digest: each through a temp file renamed into place."""
    _remove_stale_tmp(path.parent, key)
    buf = io.BytesIO()
    torch.save(weights, buf)
    raw = buf.getvalue()
    tmp = _write_new(path.parent, f"models-{key}.tmp", raw)
    digest_file = _digest_path(path)
    try:
        dtmp = _write_new(path.parent, f"{digest_file.name}.tmp", (hashlib.sha256(raw).hexdigest() + "\n").encode())
        os.replace(dtmp, digest_file)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    logger.info("cached the default models in %s", path)


@lru_cache(maxsize=4)
def _weights(seed: int, plan: TrainPlan) -> dict[str, dict[str, torch.Tensor]]:
    key = _cache_key(seed, plan, load_corpus().digest)
    folder = model_cache_dir()
    path = folder / f"models-{key}.pt"
    if not _writable(folder):
        if path.exists():  # read-only folder (an image, a shared folder): serve without writing
            cached = _load_cached(path)
            if cached is not None:
                return cached
        fallback = private_dir(_fallback_dir())  # UnsafeFolderError: another user's, or a symlink
        logger.warning("model cache folder %s is not writable; using %s instead (set DRAFTGRAPH_CACHE "
                       "to a writable folder to keep the models there)", folder, fallback)
        folder, path = fallback, fallback / path.name
    with _file_lock(folder / f"models-{key}.lock"):
        if path.exists():
            cached = _load_cached(path)
            if cached is not None:
                return cached
        weights = _train_all(seed, plan)
        _save(weights, path, key)
        return weights


def _export_complete(out: Path, stamp: str) -> bool:
    try:
        return (out / "complete").read_text().strip() == stamp
    except OSError:
        return False


def _export(weights: dict, out: Path, stamp: str) -> None:
    """Write the target with ``save_pretrained`` (``out/target``) and the head in its published
    layout (``out/eagle3``: config.json, model.safetensors) through a temporary folder renamed
    into place; ``out/complete`` holds ``stamp``, written last."""
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp", dir=out.parent))
    try:
        model = LlamaForCausalLM(target_config())
        model.load_state_dict(weights["target"], strict=True)
        model.save_pretrained(tmp / "target")
        head_config().save_pretrained(tmp / "eagle3")
        head = dict(weights["eagle"])
        t2d = torch.zeros(target_config().vocab_size, dtype=torch.bool)  # published heads carry it
        t2d[torch.arange(head["d2t"].numel()) + head["d2t"]] = True
        tensors = {**{k: v.contiguous() for k, v in head.items()}, "t2d": t2d}
        save_file(tensors, str(tmp / "eagle3" / "model.safetensors"))
        (tmp / "complete").write_text(stamp + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote the default models as checkpoints in %s (target: transformers LlamaForCausalLM; "
                "head: EAGLE-3)", out)


def _fingerprint(weights: dict, key: str) -> str:
    """The export's stamp: the cache key and a digest of the weights it was written from (a
    bundle trained again after damage writes its checkpoints again)."""
    h = hashlib.sha256(key.encode())
    for part in ("target", "eagle"):
        for name, t in sorted(weights[part].items()):
            h.update(name.encode())
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return f"{key}:{h.hexdigest()[:16]}"


def default_checkpoints(seed: int = 0, plan: TrainPlan | None = None, rewrite: bool = False) -> tuple[Path, Path]:
    """(target folder, head folder) of the default models: the target as a transformers
    checkpoint (``AutoModelForCausalLM.from_pretrained`` loads it), the head in the published
    EAGLE-3 layout; written beside the cached weights (checked on every load, trained at first
    use) when missing or written from other weights (``rewrite``: again)."""
    plan = plan or TrainPlan()
    key = _cache_key(seed, plan, load_corpus().digest)
    weights = _weights(seed, plan)
    stamp = _fingerprint(weights, key)
    out = model_cache_dir() / f"default-{key}"
    if rewrite or not _export_complete(out, stamp):
        folder = model_cache_dir() if _writable(model_cache_dir()) else private_dir(_fallback_dir())
        out = folder / f"default-{key}"
        with _file_lock(folder / f"models-{key}.lock"):
            if rewrite or not _export_complete(out, stamp):
                _export(weights, out, stamp)
    return out / "target", out / "eagle3"


def default_models(seed: int = 0, draft: str = "eagle", device: str | torch.device = "cpu",
                   plan: TrainPlan | None = None) -> tuple[HFTarget, torch.nn.Module]:
    """(target, draft), loaded from `default_checkpoints` through the user's path
    (`load_models`): the target (a transformers ``LlamaForCausalLM`` as an `HFTarget`) in
    float64; ``draft`` "eagle": the published EAGLE-3 head (`Eagle3Head`, the target's dtype),
    "multi_layer": `MultiLayerDraft` (float32). Fresh module instances on every call. A damaged
    checkpoint folder is written again from the cached weights, once."""
    if draft not in DRAFT_KINDS:
        raise ValueError(f"draft={draft!r}: must be one of {list(DRAFT_KINDS)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed={seed!r}: must be an int")
    plan = plan or TrainPlan()
    for attempt in (0, 1):
        target_dir, head_dir = default_checkpoints(seed, plan, rewrite=bool(attempt))
        try:
            if draft == "eagle":
                return load_models(target_dir, head_dir, dtype="float64", device=device)
            target = load_target(target_dir, dtype="float64", device=device)
        except ValueError as exc:
            if attempt:
                raise
            logger.warning("default model checkpoint in %s is damaged (%s); writing it again",
                           target_dir.parent, str(exc)[:300])
            continue
        break
    model = MultiLayerDraft(target, seed=seed)
    model.load_state_dict(_weights(seed, plan)["multi_layer"])
    return target, model.to(device).eval().requires_grad_(False)
