"""Side by side with transformers (issue 42 item 6): the embedded target (a ``LlamaForCausalLM``
checkpoint, `default_checkpoints`), decoded greedily by transformers' ``generate`` (dynamic
cache; static cache, also compiled; float64, and float32 for reference), assisted generation (a
1-layer Llama assistant distilled from the target's greedy outputs), prompt-lookup decoding, and
draftgraph's `SpecDecodeEngine` serving the same checkpoint through `load_models` with the
default EAGLE-3 head (chain S=3): eager, graphs (``backend="auto"``, ``capture="fill"``:
every graph captured before timing; the draft step, the CPU default) and graphs+phases (the
target verify and draft extend captured too).

One process; every system runs once per round, rounds alternate the order (A B C ... then
reversed); medians over rounds. At 4 requests ``generate`` runs the 4 prompts as one left-padded
batch; assisted generation and prompt lookup only take one sequence at a time in transformers, so
they run the 4 prompts one after another. Every output is compared to the embedded target's
greedy tokens (`greedy_generate`). Ratios (``vs_generate``, the targets) are the median over
rounds of each round's ratio, so the load's drift between rounds cancels. ``tokens/fwd``: new
tokens per target forward (1 for plain decoding; the acceptance length for the speculative
systems).

``--threads`` (default 1): torch's intra-op threads for every system alike. On this shared
2-core VM two threads spin against the other jobs' load: a target forward took ~100 ms with 2
threads against ~10 ms with 1.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_checkpoints, default_models, greedy_generate, model_cache_dir
from draftgraph.runtime.models.corpus import held_out_prompts, load_corpus
from draftgraph.runtime.models.default_spec import target_config
from draftgraph.runtime.models.hf_models import load_models
from draftgraph.runtime.models.hf_target import HFTarget
from draftgraph.runtime.models.tokenizer import EOS_ID
from draftgraph.runtime.models.training import TrainPlan, distill_data
from scripts.benchutil import emit, record
from scripts.benchutil import target as stated_target

logger = logging.getLogger(__name__)

SPEC = SpeculativeConfig(3, 1)
ASSIST_STEPS, ASSIST_BATCH, ASSIST_LR = 300, 16, 2e-3
PLD_TOKENS = 10  # prompt_lookup_num_tokens (prompt-lookup decoding's own default), 2-gram matches
# (draftgraph row, requests, baseline row, at least): stated on both graph rows, the default
# CPU graphs (the draft step) and with the verify / extend phases captured too
TARGETS = tuple((g, conc, base, limit) for g in ("graphs", "graphs+phases")
                for conc, base, limit in ((1, "generate", 2.0), (1, "assisted", 1.5), (4, "generate", 3.0)))


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def train_assistant(target: HFTarget, steps: int, plan: TrainPlan, seed: int = 0) -> Any:
    """A 1-layer ``LlamaForCausalLM`` of the target's shape (its embedding, final norm, LM head and
    first layer as the start), trained to predict the target's greedy next token on the target's
    own greedy continuations of training prompts (`distill_data`); float32."""
    from transformers import LlamaForCausalLM

    data = distill_data(target, load_corpus().train, plan, seed)
    tokens, labels = data.tokens, data.argmax
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(target_config(layers=1))
    draft.set_attn_implementation("sdpa")
    state = {k: v.float() for k, v in target.model.state_dict().items()
             if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    draft.load_state_dict(state)
    draft.train()
    opt = torch.optim.AdamW(draft.parameters(), lr=ASSIST_LR, weight_decay=0.0, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 13)
    loss = torch.tensor(0.0)
    for step in range(steps):
        for g in opt.param_groups:  # cosine decay to 5%
            g["lr"] = ASSIST_LR * max(0.05, 0.5 * (1 + torch.cos(torch.tensor(torch.pi * step / steps)).item()))
        idx = torch.randint(0, tokens.shape[0], (ASSIST_BATCH,), generator=gen)
        logits = draft(input_ids=tokens[idx], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[idx].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    agree = (logits.argmax(-1) == labels[idx]).float().mean().item()
    logger.info("assistant: %d steps, last loss %.3f, top-1 agreement %.2f on its last batch", steps, loss, agree)
    return draft.eval().requires_grad_(False)


def assistant_folder(target: HFTarget, quick: bool) -> Path:
    """The assistant as a Llama folder, trained once per (target weights, steps) and kept beside
    the default models (``$DRAFTGRAPH_CACHE``)."""
    steps, plan = (10, TrainPlan(distill_prompts=8, distill_new=16)) if quick else (ASSIST_STEPS, TrainPlan())
    folder = model_cache_dir() / f"bench_hf-assistant-{_digest(target)}-{steps}"
    if not (folder / "config.json").is_file():
        start = time.perf_counter()
        tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
        train_assistant(target, steps, plan).save_pretrained(tmp)
        try:  # whole or not at all: another process may have finished first
            os.replace(tmp, folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"trained the assistant ({steps} steps) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return folder


class _Counter:
    """Counts a model's forward calls (target forwards per generated token)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1


def _hf_systems(folder: Path, assistant: Path, prompts: list[list[int]], n: int, compiled: bool
                ) -> dict[str, tuple[Callable[[], list[list[int]]], _Counter]]:
    """transformers' systems: name -> (run the prompts, the target's forward counter)."""
    from transformers import LlamaForCausalLM

    def load(path: Path, dtype: torch.dtype) -> Any:
        return LlamaForCausalLM.from_pretrained(path, dtype=dtype).eval()

    f64, f32, small = load(folder, torch.float64), load(folder, torch.float32), load(assistant, torch.float64)
    base = dict(do_sample=False, max_new_tokens=n, pad_token_id=EOS_ID, eos_token_id=None)

    def batched(model: Any, **kw: Any) -> Callable[[], list[list[int]]]:
        width = max(map(len, prompts))  # left padding, as generate expects for a decoder-only batch
        ids = torch.tensor([[EOS_ID] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

        def run() -> list[list[int]]:
            with torch.no_grad():
                return model.generate(ids, attention_mask=mask, **base, **kw)[:, width:].tolist()
        return run

    def one_by_one(model: Any, **kw: Any) -> Callable[[], list[list[int]]]:
        def run() -> list[list[int]]:
            out = []
            with torch.no_grad():
                for p in prompts:
                    ids = torch.tensor([p])
                    gen = model.generate(ids, attention_mask=torch.ones_like(ids), **base, **kw)
                    out.append(gen[0, len(p):].tolist())
            return out
        return run

    c64, c32 = _Counter(f64), _Counter(f32)
    systems = {"generate": (batched(f64), c64),
               "generate static": (batched(f64, cache_implementation="static"), c64)}
    if compiled:  # transformers compiles a static-cache forward on the CPU only when asked to
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = True  # noqa: SLF001  (CompileConfig's switch for non-GPU devices)
        systems["generate static compiled"] = (batched(f64, cache_implementation="static", compile_config=config),
                                               c64)
    systems["generate f32"] = (batched(f32), c32)
    systems["assisted"] = (one_by_one(f64, assistant_model=small), c64)
    systems["prompt lookup"] = (one_by_one(f64, prompt_lookup_num_tokens=PLD_TOKENS), c64)
    return systems


def _engines(folder: Path, head: Path, max_len: int, phases: bool, graph_backend: str
             ) -> dict[str, SpecDecodeEngine]:
    target, draft = load_models(folder, head, "float64", max_len=max_len)
    args = RuntimeArgs(SPEC, CudaGraphConfig(PhaseGraphConfig(bs=(1, 4))), max_running_requests=4)
    out = {"draftgraph eager": SpecDecodeEngine(args, target, draft, backend="eager")}
    start = time.perf_counter()
    out["draftgraph graphs"] = SpecDecodeEngine(args, target, draft, backend=graph_backend, capture="fill")
    print(f"graphs ({graph_backend}, draft step) captured in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if phases:
        start = time.perf_counter()
        out["draftgraph graphs+phases"] = SpecDecodeEngine(args, target, draft, backend="auto", capture="fill",
                                                           graph_phases=("verify", "extend"))
        print(f"graphs (auto, draft, verify, extend) captured in {time.perf_counter() - start:.0f} s",
              file=sys.stderr)
    return out


def _round_ratio(base: list[float], other: list[float]) -> float:
    """Speed of ``other`` over ``base``: the median over rounds of each round's ratio of times
    (both ran in that round, so the load's drift between rounds cancels)."""
    return statistics.median(b / o for b, o in zip(base, other, strict=True))


def main(argv: list[str] | None = None) -> dict:
    if argv and any(x == "--target" or x.startswith("--target=") for x in argv):
        from scripts import bench_real  # the real model (SmolLM2 or a checkpoint): its own systems and rows

        return bench_real.main(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="8 new tokens, one round, a briefly trained assistant, "
                   "trace graphs, no compiled rows")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 4; --quick 1)")
    p.add_argument("--new-tokens", type=int, default=None, help="new tokens per request (default 96; --quick 8)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--no-phases", action="store_true", help="skip the verify/extend graphs row")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rounds = a.rounds or (1 if a.quick else 4)
    n = a.new_tokens or (8 if a.quick else 96)
    phases = not (a.quick or a.no_phases)
    target, _ = default_models()
    folder, head = default_checkpoints()
    assistant = assistant_folder(target, a.quick)
    rows, records, engines = [], [], {}
    per_round: dict[int, dict[str, list[float]]] = {}
    try:
        # "auto" compiles each capture size (seconds warm, up to a minute cold under load);
        # --quick (a smoke test) records with trace instead, as bench_engine does
        engines = _engines(folder, head, 256, phases, "trace" if a.quick else "auto")
        for conc in (1, 4):
            prompts = [list(x) for x in held_out_prompts(conc, seed=40 + conc)]
            ref = greedy_generate(target, prompts, n)
            systems: dict[str, tuple[Callable[[], list[list[int]]], _Counter | None]] = \
                _hf_systems(folder, assistant, prompts, n, compiled=not a.quick)
            for name, eng in engines.items():
                systems[name] = ((lambda e=eng, ps=prompts: e.generate(ps, n)), None)
            warm = {name: fn() for name, (fn, _) in systems.items()}  # untimed: lazy init, allocator
            del warm
            times: dict[str, list[float]] = {k: [] for k in systems}
            fwd: dict[str, float] = {}
            same: dict[str, bool] = {k: True for k in systems}
            order = list(systems)
            for r in range(rounds):
                for name in (order if r % 2 == 0 else order[::-1]):
                    fn, counter = systems[name]
                    before = counter.calls if counter else 0
                    if name in engines:
                        engines[name].reset_stats()
                    start = time.perf_counter()
                    out = fn()
                    times[name].append(time.perf_counter() - start)
                    same[name] &= out == ref
                    fwd[name] = (engines[name].stats()["accept_length_mean"] if name in engines
                                 else conc * n / max(1, (counter.calls - before)) if name.startswith(
                                     ("assisted", "prompt")) else 1.0)
            tokens = conc * n
            per_round[conc] = times
            for name, ts in times.items():
                t, vs = statistics.median(ts), _round_ratio(times["generate"], ts)
                backend = "-"
                if name in engines:
                    graphs = engines[name].worker.state.graphs
                    backend = graphs.backend_name if graphs is not None else "eager"
                rows.append({"requests": conc, "system": name, "backend": backend, "tokens_per_s": tokens / t,
                             "vs_generate": vs, "tokens_per_fwd": fwd[name], "identical_to_greedy": same[name]})
                records.append(record("hf", f"{name} requests={conc}",
                                      {"system": name, "requests": conc, "max_new": n, "threads": a.threads},
                                      "tokens_per_s", [tokens / x for x in ts], backend=backend,
                                      ratios={"vs_generate": vs, "tokens_per_fwd": fwd[name]}))
    finally:
        for eng in engines.values():
            eng.close()
    verdicts = {}
    for graphs, conc, base, limit in TARGETS:
        name = f"draftgraph {graphs}"
        if name not in per_round[conc]:
            continue
        label = f"{name}, {conc} request{'s' if conc > 1 else ''}: >= {limit:g}x {base}"
        ratio = _round_ratio(per_round[conc][base], per_round[conc][name])
        verdicts[label] = {"ratio": ratio, "met": ratio >= limit}
        for rec in records:
            if rec["case"] == f"{name} requests={conc}":
                rec["targets"].append(stated_target(label, ratio, ">=", limit))
    extra = {"new_tokens": n, "rounds": rounds, "threads": a.threads, "spec": "chain S=3",
             "sequential_at_4": ["assisted", "prompt lookup"], "prompt_lookup_num_tokens": PLD_TOKENS,
             "assistant": "1-layer Llama (target shape), distilled from the target's greedy outputs",
             "targets": verdicts, "records": records}
    return emit("bench_hf", rows, ["requests", "system", "backend", "tokens_per_s", "vs_generate",
                                   "tokens_per_fwd", "identical_to_greedy"], extra, a.json)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
