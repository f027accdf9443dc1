"""`train_head`: an EAGLE-3 head for a transformers target, made by self-distillation in a time
budget (the job of ``draftgraph train-head``).

1. The target's greedy answers to the prompts (`head_data`), with its features, are generated
   once and cached in ``OUT/.train/data.pt`` (a later run of the same setup reuses them).
2. The draft vocabulary is the ``draft_vocab`` ids the target writes most in its answers; the
   head's LM head and norm start from the target's rows and final norm (`training.init_eagle3`).
3. The head trains on the cached features until the budget ends (`head_train`), checkpointing
   in ``OUT/.train/state.pt``: a stopped run resumes there.
4. The head is written in the published EAGLE-3 layout (``OUT/config.json``,
   ``OUT/model.safetensors``: ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``),
   loadable by `load_models` / ``--draft OUT``, and its held-out acceptance measured (`head_eval`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .eagle_heads import Eagle3Head
from .head_data import Sample, encode_prompts, generate_samples, read_prompts, register_gen_attention, shipped_split
from .head_eval import accept_length
from .head_train import TrainState, draft_ids, load_state, save_state, train_loop
from .hf_load import load_config, load_target, parse_dtype
from .hf_models import eagle3_layers
from .hf_target import NORMED, HFTarget
from .hf_text import load_tokenizer
from .training import init_eagle3

__all__ = ["HeadReport", "HeadTrainConfig", "cached_samples", "eagle3_config", "save_head", "train_head"]

logger = logging.getLogger(__name__)

Bar = Callable[[str, int, str], Any]  # (description, total, unit) -> a tqdm-like bar


@dataclass(frozen=True)
class HeadTrainConfig:
    """How `train_head` trains: ``minutes`` of wall time in all (``data_share`` of it at most
    answering prompts), ``max_new`` answer tokens, ``steps_unroll`` draft passes per position;
    the held-out answers come from the target in ``dtype`` (the one served), the training answers
    from it in ``data_dtype`` (bfloat16: about 1.5x faster on a CPU, the same model's text)."""

    minutes: float = 20.0
    draft_vocab: int = 8192
    steps_unroll: int = 5
    max_new: int = 256
    gen_batch: int = 16
    data_share: float = 0.5
    batch_tokens: int = 2048
    lr: float = 1e-3
    decay: float = 0.8
    seed: int = 0
    checkpoint_s: float = 120.0
    eval_steps: tuple[int, ...] = (3, 4)
    held_out: int = 40
    max_steps: int = 0
    dtype: str = "float32"
    data_dtype: str = "float32"
    train_dtype: str = "bfloat16"
    save_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        checks = {"minutes": self.minutes > 0, "draft_vocab": self.draft_vocab >= 1,
                  "steps_unroll": 1 <= self.steps_unroll <= 16, "max_new": self.max_new >= 2,
                  "gen_batch": self.gen_batch >= 1, "data_share": 0 < self.data_share < 1,
                  "batch_tokens": self.batch_tokens >= 1, "lr": self.lr > 0, "decay": 0 < self.decay <= 1,
                  "held_out": self.held_out >= 1, "eval_steps": bool(self.eval_steps) and all(
                      1 <= s <= self.steps_unroll for s in self.eval_steps),
                  "max_steps": self.max_steps >= 0, "dtype": self.dtype in ("float32", "float64"),
                  "data_dtype": self.data_dtype in ("float32", "float64", "bfloat16"),
                  "train_dtype": self.train_dtype in ("float32", "bfloat16"),
                  "save_dtype": self.save_dtype in ("float32", "bfloat16", "float16")}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"{bad[0]}={getattr(self, bad[0])!r}: out of range (minutes > 0, draft_vocab >= 1, "
                             f"1 <= steps_unroll <= 16, max_new >= 2, 0 < data_share < 1, 0 < decay <= 1, "
                             f"eval_steps within 1..steps_unroll, max_steps >= 0, dtype float32|float64, "
                             f"data_dtype float32|float64|bfloat16, train_dtype float32|bfloat16, "
                             f"save_dtype float32|bfloat16|float16)")


@dataclass(frozen=True)
class HeadReport:
    """What `train_head` did: the head's folder, its held-out acceptance by chain length S,
    seconds spent answering and training, the training samples and answer tokens, the last loss."""

    out: Path
    accept: dict[int, float]
    data_s: float
    train_s: float
    samples: int
    tokens: int
    loss: float
    resumed: bool


def eagle3_config(target_config: Any, layers: tuple[int, ...], draft_vocab: int) -> Any:
    """The head's Llama config for ``target_config``: one decoder layer of the target's widths,
    the streams it reads (``eagle_aux_hidden_state_layer_ids``: layer outputs, so stream i is id
    i - 1) and its draft vocabulary (the keys SpecForge writes)."""
    from transformers import LlamaConfig

    t = target_config
    heads = t.num_attention_heads
    config = LlamaConfig(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=getattr(t, "num_key_value_heads", heads),
                         head_dim=getattr(t, "head_dim", None) or t.hidden_size // heads, vocab_size=t.vocab_size,
                         max_position_embeddings=t.max_position_embeddings, rms_norm_eps=t.rms_norm_eps,
                         rope_parameters=dict(getattr(t, "rope_parameters", None) or {"rope_type": "default",
                                                                                        "rope_theta": 10000.0}),
                         tie_word_embeddings=False, attention_bias=False, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None, architectures=["LlamaForCausalLMEagle3"])
    config.draft_vocab_size = draft_vocab
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]}
    return config


def save_head(head: Eagle3Head, config: Any, out: Path, dtype: str) -> None:
    """The head in the published layout: ``out/config.json`` and ``out/model.safetensors``
    (floating tensors in ``dtype``; ``d2t`` int64 and ``t2d`` bool [V], as SpecForge writes)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    want = getattr(torch, dtype)
    tensors = {k: (v.to(want) if v.is_floating_point() else v).contiguous() for k, v in head.state_dict().items()}
    t2d = torch.zeros(head.cfg.vocab_size, dtype=torch.bool)
    t2d[torch.arange(head.cfg.draft_vocab_size) + tensors["d2t"]] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(out / "model.safetensors"))
    config.save_pretrained(out)


def _stamp(source: str, target: HFTarget, prompts: list[list[int]], cfg: HeadTrainConfig) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps([source, target.cfg.config_json, prompts, cfg.max_new, cfg.dtype,
                                        cfg.held_out]).encode()).hexdigest()
    return {"data": digest, "data_dtype": cfg.data_dtype, "draft_vocab": cfg.draft_vocab,
            "steps_unroll": cfg.steps_unroll, "seed": cfg.seed}


def _plain(samples: list[Sample]) -> dict[str, list[Any]]:
    return {"tokens": [s.tokens for s in samples], "answer": [s.answer for s in samples],
            "features": [s.features for s in samples]}


def _samples(plain: dict[str, list[Any]]) -> list[Sample]:
    return [Sample(*parts) for parts in zip(plain["tokens"], plain["answer"], plain["features"])]


def cached_samples(out: str | Path) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) samples `train_head` cached in ``out/.train/data.pt``."""
    data = torch.load(Path(out) / ".train" / "data.pt", map_location="cpu", weights_only=True)
    return _samples(data["train"]), _samples(data["held"])


def _hf_model(source: str, dtype: str) -> Any:
    """The checkpoint (checked by `load_target` before) as transformers runs it, on the
    answering attention (`head_data.register_gen_attention`)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(source, dtype=parse_dtype(dtype), trust_remote_code=False,
                                                attn_implementation=register_gen_attention()).eval()


def _data(target: HFTarget, tokenizer: Any, prompts: Any, cfg: HeadTrainConfig, work: Path, source: str,
          deadline: float, bar: Bar) -> tuple[list[Sample], list[Sample], dict[str, Any]]:
    """(training samples, held-out samples, the setup stamp): cached in ``work/data.pt``."""
    if prompts is None:
        train_p, held_p = shipped_split()
    else:
        msgs = read_prompts(prompts)
        cut = min(cfg.held_out, max(1, len(msgs) // 10))
        if len(msgs) < 2:
            raise ValueError(f"prompts={str(prompts)!r}: at least 2 prompts (one is held out for evaluation)")
        train_p, held_p = msgs[:-cut], msgs[-cut:]
    limit = target.cfg.max_len - cfg.max_new
    enc_t, enc_h = (encode_prompts(p, tokenizer, target.vocab_size) for p in (train_p, held_p))
    enc_t, enc_h = [p for p in enc_t if len(p) <= limit], [p for p in enc_h if len(p) <= limit]
    if not enc_t or not enc_h:
        raise ValueError(f"prompts: none fits the cache ({target.cfg.max_len} positions, {cfg.max_new} for the answer)")
    stamp = _stamp(source, target, enc_t + enc_h, cfg)
    path = work / "data.pt"
    if path.is_file():
        data = torch.load(path, map_location="cpu", weights_only=True)
        if all(data.get("stamp", {}).get(k) == stamp[k] for k in ("data", "data_dtype")):
            logger.info("reusing the answers cached in %s", path)
            return _samples(data["train"]), _samples(data["held"]), stamp
    eos = [i for i in [getattr(tokenizer, "eos_token_id", None)] if isinstance(i, int)]
    layers = target.cfg.feature_layers
    with bar("answering held-out prompts", len(enc_h), "prompt") as b:
        held = generate_samples(_hf_model(source, cfg.dtype), layers, enc_h, cfg.max_new, eos, cfg.gen_batch,
                                None, b.update)
    with bar("answering training prompts", len(enc_t), "prompt") as b:
        train = generate_samples(_hf_model(source, cfg.data_dtype), layers, enc_t, cfg.max_new, eos, cfg.gen_batch,
                                 deadline, b.update)
    work.mkdir(parents=True, exist_ok=True)
    torch.save({"stamp": stamp, "train": _plain(train), "held": _plain(held)}, work / "data.tmp")
    (work / "data.tmp").replace(path)
    return train, held, stamp


def train_head(target: str | Path, out: str | Path, cfg: HeadTrainConfig, prompts: str | Path | None, bar: Bar
               ) -> HeadReport:
    """Train an EAGLE-3 head for checkpoint ``target`` into folder ``out`` (module docstring);
    ``prompts``: a JSONL file (None: the shipped set); ``bar`` makes the progress bars."""
    start = time.monotonic()
    budget = cfg.minutes * 60
    torch.manual_seed(cfg.seed)
    out, source = Path(out), str(target)
    tconf = load_config(target)
    layers = eagle3_layers({}, tconf.num_hidden_layers, Path(source) / "config.json")
    max_len = min(1024, getattr(tconf, "max_position_embeddings", 1024) or 1024)
    model = load_target(target, dtype=cfg.dtype, max_len=max_len, feature_layers=(*layers, NORMED))
    tokenizer = load_tokenizer(target, model.vocab_size)
    train, held, stamp = _data(model, tokenizer, prompts, cfg, out / ".train", source,
                               start + cfg.data_share * budget, bar)
    data_s = time.monotonic() - start
    vd = min(cfg.draft_vocab, model.vocab_size)
    config = eagle3_config(tconf, layers, vd)
    # the head's view of the target: the same model read at the head's three streams
    view = HFTarget(model.model, model.cfg.max_len, feature_layers=layers)
    head = Eagle3Head(config, view, draft_vocab_size=vd, biased=frozenset())
    init_eagle3(head, view, draft_ids(train, vd, model.vocab_size))
    w_draft = model.lm_head.weight.detach()[torch.arange(vd) + head.d2t].float()
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    ckpt = out / ".train" / "state.pt"
    state = load_state(ckpt, head, opt, stamp)
    resumed = state is not None
    reserve = min(60.0, 0.05 * budget)
    left = max(0.0, budget - (time.monotonic() - start) - reserve)
    if state is None:
        state = TrainState(planned=left)
    else:  # resumed: train on to the planned end, or further when this run has more time
        state.planned = max(state.planned, state.seconds + left)
    with bar("training the head", int(min(left, state.planned - state.seconds)) + 1, "s") as b:
        def progress(dt: float, st: TrainState, agree: list[float]) -> None:
            b.set_postfix(loss=f"{st.loss:.3f}", top1="/".join(f"{a:.2f}" for a in agree), refresh=False)
            b.update(dt)

        train_loop(head, opt, w_draft, train, state, start + budget - reserve, cfg,
                   lambda: save_state(ckpt, head, opt, state, stamp), progress)
    save_head(head, config, out, cfg.save_dtype)
    with torch.no_grad():  # measure the head as saved (its weights rounded to save_dtype)
        for p in head.parameters():
            p.copy_(p.to(getattr(torch, cfg.save_dtype)))
    accept = accept_length(head, held, cfg.eval_steps)
    (out / ".train" / "report.json").write_text(json.dumps({"accept": accept, "config": asdict(cfg),
                                                             "state": vars(state)}, indent=1))
    return HeadReport(out, accept, data_s, state.seconds, len(train), sum(s.tokens.numel() - s.answer for s in train),
                      state.loss, resumed)
