"""`draftgraph simulate`: seeded requests arrive over time into a `SpecDecodeEngine` (so the batch
size varies), adaptive switching on, a reload at a given step and on SIGHUP; then the same
requests through target-only greedy decoding for the speedup and the lossless check."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal as _signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from draftgraph.graphs import capabilities
from draftgraph.runtime import RuntimeArgs, load_runtime_args

from ..engine.engine import SpecDecodeEngine
from ..engine.model_seam import DraftTarget
from ..engine.profiling import profile_steps
from ..engine.requests import RequestFailed
from ..models import default_checkpoints, default_models, greedy_generate, sampled_generate
from ..models.corpus import held_out_prompts
from ..models.defaults import DRAFT_KINDS
from ..models.hf_eagle import HFEagleHead
from ..sampling import GREEDY, SamplingParams
from ..sampling.params import MAX_SEED
from .signals import ProcessReloadSignal

__all__ = ["SimulationConfig", "bar_safe_logging", "run_simulation", "wait_with_progress"]

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0  # the longest wait after the loop for a capture unit in progress


@dataclass(frozen=True)
class SimulationConfig:
    """What `run_simulation` serves and how."""

    args: RuntimeArgs
    draft: str = "eagle"
    backend: str = "auto"
    seed: int = 0
    requests: int = 24
    arrival: float = 0.5
    adaptive_steps: tuple[int, ...] = (1, 2, 3, 4, 5)
    max_loop_steps: int = 2000
    min_new: int = 16
    max_new: int = 96
    reload_at: int | None = None
    reload_config: str | None = None
    greedy: bool = True
    profile_dir: str | None = None
    profile_steps: tuple[tuple[int, int], ...] | None = None  # windows of engine steps (None: all)
    profile_spans_only: bool = False
    progress: bool = True
    poll_every: int = 8
    capture: str = "auto"  # "auto", "background" or "blocking" (`SpecDecodeEngine`'s "fill" here)
    graph_phases: tuple[str, ...] | None = None  # verify / extend graphs (None: the backend's default)
    eager_baseline: bool = True  # the same requests through the eager backend too (graph backends)
    target: str | None = None  # a transformers checkpoint (folder or hub id); draft is then a head's folder
    dtype: str = "float64"  # the transformers target's dtype
    weights: str = "dense"  # its linear layers: "dense" or "q4" (`models.q4_linear`)
    max_len: int | None = None  # the transformers target's cache positions per request (None: its default)
    prompts: str | None = None  # a JSONL prompt file (None: the shipped chat prompts, or held-out bytes)
    model_name: str | None = None  # what the report calls the model
    sampling: SamplingParams | None = None  # None: greedy; request i draws with seed + i (the plain baseline too)

    def request_sampling(self, i: int) -> SamplingParams | None:
        """Request ``i``'s parameters: ``sampling`` with seed + i (None: greedy)."""
        if self.sampling is None or self.sampling.greedy:
            return self.sampling
        return self.sampling.with_seed(((self.sampling.seed or 0) + i) % (MAX_SEED + 1))

    def __post_init__(self) -> None:
        if self.target is None and self.draft not in DRAFT_KINDS:
            raise ValueError(f"--draft={self.draft!r}: without --target it must be one of {list(DRAFT_KINDS)} "
                             f"(the embedded drafts); a published head's folder needs --target")
        if self.target is not None and self.draft in DRAFT_KINDS:
            raise ValueError(f"--target={self.target!r}: needs --draft DIR (a published EAGLE head's folder)")
        if self.requests < 1:
            raise ValueError(f"requests={self.requests}: must be >= 1")
        if not 0.0 < self.arrival:
            raise ValueError(f"arrival={self.arrival}: must be > 0 (requests per step)")
        if self.profile_spans_only and self.profile_dir is None:
            raise ValueError("--profile-spans-only: needs --profile DIR (the trace's folder)")


def _rss_mib() -> float:
    """Resident set size in MiB: psutil when installed, else /proc/self/statm, else NaN."""
    try:
        import psutil  # the `test` extra; a plain install reads /proc instead
    except ImportError:
        psutil = None
    if psutil is not None:
        return psutil.Process().memory_info().rss / 2**20
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError, AttributeError):
        return float("nan")


def _reload_from(engine: SpecDecodeEngine, path: str, why: str) -> None:
    """Load the args file and queue a reload; a bad file (or a refused reload, whatever the
    error) is reported and serving continues: this also runs from the SIGHUP handler."""
    try:
        engine.request_reload(load_runtime_args(path))
        logger.info("reload from %s queued (%s)", path, why)
    except Exception as exc:
        print(f"draftgraph: reload rejected ({why}), still serving the previous state: {exc}",
              file=sys.stderr)


def _take(engine: SpecDecodeEngine, rid: int) -> list[int]:
    """The tokens of request ``rid``: taken when it ended (a failed one: none), else so far."""
    try:
        out = engine.pop_result(rid)
    except RequestFailed as exc:
        logger.error("%s", exc)
        return []
    return engine.result(rid) if out is None else out


def _units(engine: SpecDecodeEngine) -> tuple[int, int]:
    """(units done or failed, units in all) over the engine's states."""
    states = engine.startup()["states"]
    done = sum(len(s["sizes_ready"]) + len(s["sizes_failed"]) for s in states)
    return done, done + sum(len(s["sizes_pending"]) for s in states)


@contextlib.contextmanager
def bar_safe_logging() -> Iterator[None]:
    """While a progress bar is on stderr, console log records go through ``tqdm.write`` (the bar
    is cleared, the message printed on a line of its own, the bar drawn again below): a warning
    from another thread (a rejected SIGHUP reload) never lands on the bar's line. The level of
    Python's last-resort handler (WARNING) is kept when no console handler was configured."""
    try:
        from tqdm.contrib.logging import logging_redirect_tqdm
    except ImportError:  # tqdm is a dependency; stay usable without it
        yield
        return
    configured = list(logging.root.handlers)
    with logging_redirect_tqdm():
        added = [h for h in logging.root.handlers if h not in configured]
        if not any(isinstance(h, logging.StreamHandler) for h in configured):
            for handler in added:
                handler.setLevel(logging.lastResort.level if logging.lastResort else logging.WARNING)
        yield


def wait_with_progress(engine: SpecDecodeEngine, poll_s: float = 0.25) -> None:
    """Wait until no capture unit is pending, with a progress bar on stderr (units done of all,
    time left) when tqdm is installed; without it, one log line per unit."""
    done, total = _units(engine)
    if done >= total:
        return
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency; stay usable without it
        tqdm = None
    estimate = engine.startup().get("graphs_eta") or {}
    eta = estimate.get("seconds")
    desc = "draftgraph graphs (before serving, once)" if engine.capture == "fill" else "draftgraph graphs"
    # a figure from this run's own units only: the store's earlier units may be another model's
    # (the toy's take seconds where a 30-layer model's take minutes); tqdm shows the time left
    if eta and estimate.get("basis") == "measured":
        desc += f" ~{eta:.0f} s"
    bar = tqdm(total=total, initial=done, desc=desc, unit="unit", file=sys.stderr,
               dynamic_ncols=True) if tqdm is not None else None
    with bar_safe_logging() if bar is not None else contextlib.nullcontext():
        _follow_units(engine, bar, done, poll_s)


def _follow_units(engine: SpecDecodeEngine, bar: Any, done: int, poll_s: float) -> None:
    try:
        while not engine.worker.capture.wait(poll_s):
            now, total = _units(engine)
            if bar is not None:
                bar.total = total
                bar.update(now - done)
            elif now != done:
                logger.info("graphs: %d of %d capture units done", now, total)
            done = now
        now, total = _units(engine)
        if bar is not None:
            bar.total = total
            bar.update(now - done)
    finally:
        if bar is not None:
            bar.close()


def run_simulation(cfg: SimulationConfig, sighup: int | None = getattr(_signal, "SIGHUP", None),
                   rank: int | None = None, world_size: int = 1,
                   reload_signal: ProcessReloadSignal | None = None, registry: Any = None) -> dict[str, Any]:
    """Serve ``cfg.requests`` seeded requests; returns the report (see the CLI). With ``rank``
    (inside `spawn_ranks`) the engine serves under a `RankCoordinator` and the reload at
    ``reload_at`` is proposed by the last rank only.

    ``sighup`` is taken from the start (before the models load) to the end (see
    `ProcessReloadSignal`); a caller that owns a longer life (the CLI) passes its own
    ``reload_signal`` instead. Ctrl-C (KeyboardInterrupt) in the loop ends it: the report then
    covers what finished, ``interrupted`` is True and there is no greedy baseline. With
    ``registry`` (a prometheus_client registry) the engine's metrics are registered in it and stay
    there after the run."""
    own = None
    if reload_signal is None and sighup is not None:
        own = reload_signal = ProcessReloadSignal(cfg.reload_config, signum=sighup).install()
    try:
        return _run_simulation(cfg, rank, world_size, reload_signal, registry)
    finally:
        if own is not None:
            own.uninstall()


@dataclass(frozen=True)
class _Workload:
    """What the loop serves: the models, the prompts' ids (and the texts they were made from, for
    the report's sample answers), the tokenizer and its eos id (None: requests run to their length)."""

    target: Any
    draft: Any
    prompts: list[list[int]]
    texts: list[str]
    tokenizer: Any
    eos_id: int | None
    source: dict[str, str]


def _models_and_prompts(cfg: SimulationConfig) -> _Workload:
    """The embedded toy (its checkpoints, through the same loader) with byte prompts, or the
    transformers checkpoints of ``cfg.target`` / ``cfg.draft``: real chat prompts through the
    model's chat template when it has one (``cfg.prompts`` or the shipped set), else the held-out
    texts in the target's vocabulary; requests stop at the model's eos."""
    from ..models.prompt_file import demo_prompts, encode_all, has_chat_template, read_prompt_file

    if cfg.target is None:
        from ..models import default_tokenizer

        target, draft = default_models(seed=cfg.seed, draft=cfg.draft)
        target_dir, head_dir = default_checkpoints(seed=cfg.seed)
        source = {"target": str(target_dir), "draft": str(head_dir) if cfg.draft == "eagle" else "embedded"}
        if cfg.prompts is not None:
            tok = default_tokenizer()
            items = read_prompt_file(cfg.prompts)[:cfg.requests]
            return _Workload(target, draft, encode_all(tok, items, raw=True), [p.text for p in items], tok, None,
                             source)
        texts = held_out_prompts(cfg.requests, seed=cfg.seed + 100)
        return _Workload(target, draft, [list(p) for p in texts], [], None, None, source)
    from ..models.hf_models import load_models
    from ..models.hf_text import eos_id_of, load_tokenizer, prompts_for

    target, draft = load_models(cfg.target, cfg.draft, cfg.dtype, max_len=cfg.max_len, weights=cfg.weights)
    tok = load_tokenizer(cfg.target, target.vocab_size)
    source = {"target": str(cfg.target), "draft": str(cfg.draft), "weights": cfg.weights}
    if cfg.prompts is not None or has_chat_template(tok):
        items = read_prompt_file(cfg.prompts)[:cfg.requests] if cfg.prompts else demo_prompts(cfg.requests)
        return _Workload(target, draft, encode_all(tok, items), [p.text for p in items], tok, eos_id_of(tok), source)
    texts = held_out_prompts(cfg.requests, seed=cfg.seed + 100)
    return _Workload(target, draft, prompts_for(texts, tok, target.vocab_size), [], tok, None, source)


def describe_models(target: DraftTarget, draft: Any, source: dict[str, str]) -> dict[str, str]:
    """What serves, in words: the target's architecture (run by transformers' own model code)
    and the draft's format, each with where it was loaded from."""
    arch = target.describe().get("architecture", type(target).__name__)
    if isinstance(draft, HFEagleHead):
        fmt = {"eagle1": "EAGLE-1/2", "eagle3": "EAGLE-3"}[draft.fmt]
        head = f"{fmt} head (published layout) from {source['draft']}"
    else:
        head = f"{type(draft).__name__} ({source['draft']})"
    q4 = hasattr(target, "describe") and target.describe().get("weights") == "q4"
    how = " (Q4_1 codes through the int4 kernel, float64 stream)" if q4 else ""
    return {"target": f"{arch} through transformers{how} from {source['target']}", "draft": head}


@dataclass(frozen=True)
class _Arrivals:
    """The seeded workload: tokens asked per request and the loop step each arrives at."""

    max_new: list[int]
    steps: list[int]


@dataclass(frozen=True)
class _LoopRun:
    """What the serving loop did: the ids it added, the results taken as they ended, its steps,
    (step, time, tokens) when every graph was ready, start time and seconds, whether Ctrl-C
    ended it, the profile's report, whether the capture stopped in time and the RSS it added."""

    ids: list[int]
    taken: dict[int, list[int]]
    steps: int
    ready: tuple[int, float, int] | None
    start: float
    loop_s: float
    interrupted: bool
    profile: Any
    capture_stopped: bool
    rss_mib: float


def _arrivals(cfg: SimulationConfig, n: int) -> _Arrivals:
    """Tokens per request and arrival steps of ``n`` requests, drawn from ``cfg.seed``."""
    rng = random.Random(cfg.seed)
    max_new = [rng.randint(cfg.min_new, cfg.max_new) for _ in range(n)]
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(int(t))
        t += rng.expovariate(cfg.arrival)
    return _Arrivals(max_new, arrivals)


def _engine_for(cfg: SimulationConfig, target: Any, draft: Any, rank: int | None,
                registry: Any, eos_id: int | None = None) -> SpecDecodeEngine:
    """The simulated engine, under a `RankCoordinator` with ``rank``, its metrics in ``registry``."""
    # ranks capture blocking: every rank must replay the same graph at every step. A single
    # process asked to block fills instead: the units queued, compiled in a process per core and
    # waited for with a progress bar (the same graphs before the first step; the bar says how
    # long is left). "auto" fills on a machine with few cores (`capture_choice`).
    capture = "blocking" if rank is not None else "fill" if cfg.capture == "blocking" else cfg.capture
    engine = SpecDecodeEngine(cfg.args, target, draft, backend=cfg.backend,
                              adaptive_steps=cfg.adaptive_steps or None, capture=capture,
                              graph_phases=cfg.graph_phases, eos_id=eos_id,
                              progress=wait_with_progress if cfg.progress else None)
    if rank is not None:
        from draftgraph.runtime.ranks.coordinator import RankCoordinator
        engine.attach_coordinator(RankCoordinator(engine.worker, poll_every=cfg.poll_every))
    if registry is not None:
        from ..engine.metrics import register_engine_metrics
        register_engine_metrics(engine, registry)
    return engine


def _run_simulation(cfg: SimulationConfig, rank: int | None, world_size: int,
                    reload_signal: ProcessReloadSignal | None, registry: Any = None) -> dict[str, Any]:
    rss0 = _rss_mib()
    load = _models_and_prompts(cfg)
    target, draft, prompts = load.target, load.draft, load.prompts
    work = _arrivals(cfg, len(prompts))
    engine = _engine_for(cfg, target, draft, rank, registry, load.eos_id)
    rss_setup = _rss_mib() - rss0
    if reload_signal is not None:
        reload_signal.attach(engine)  # one that came while loading is requested now
    run = _serve(cfg, engine, prompts, work, rank, world_size, reload_signal)
    outs = [run.taken[i] if i in run.taken else _take(engine, i) for i in run.ids]
    report = _loop_report(engine, run, describe_models(target, draft, load.source), work.max_new)
    report.update({"rss_setup_mib": rss_setup, "rss_loop_mib": run.rss_mib, "torch": torch.__version__,
                   "model": cfg.model_name, "answers": _answers(load, outs),
                   "sampling": asdict(cfg.sampling) if cfg.sampling is not None else None})
    return _with_baselines(report, cfg, engine, run, outs, load, work, rank, reload_signal)


def _answers(load: _Workload, outs: list[list[int]], n: int = 2) -> list[dict[str, str]]:
    """The first ``n`` prompts and their answers as text (none for byte prompts without texts)."""
    from ..models.hf_text import eos_id_of

    if not load.texts or load.tokenizer is None:
        return []
    eos = eos_id_of(load.tokenizer)
    return [{"prompt": text, "answer": load.tokenizer.decode([t for t in out if t != eos],
                                                             skip_special_tokens=True).strip()}
            for text, out in list(zip(load.texts, outs))[:n]]


def _serve(cfg: SimulationConfig, engine: SpecDecodeEngine, prompts: list[list[int]], work: _Arrivals,
           rank: int | None, world_size: int, reload_signal: ProcessReloadSignal | None) -> _LoopRun:
    """The loop: requests arrive at their steps, the reload at ``cfg.reload_at`` (by the last rank
    only), one engine step per turn, with a token bar; Ctrl-C ends it. Then the capture stops."""
    max_new, arrivals = work.max_new, work.steps
    bar = None
    quiet_bar = contextlib.ExitStack()  # log records above the bar while it is shown
    if cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=sum(max_new), desc="draftgraph simulate", unit="tok", file=sys.stderr)
        quiet_bar.enter_context(bar_safe_logging())
    ids: list[int] = []
    taken: dict[int, list[int]] = {}  # results taken as requests end: the engine keeps none
    nxt, step = 0, 0
    ready: tuple[int, float, int] | None = None  # (step, time, tokens) when every graph was ready
    rss1 = _rss_mib()
    start = time.perf_counter()
    interrupted, prof = False, None
    try:
        profiling = cfg.profile_dir is not None or cfg.profile_steps is not None
        with profile_steps(engine, cfg.profile_dir, cfg.profile_steps, cfg.profile_spans_only) \
                if profiling else contextlib.nullcontext(None) as prof:
            while (nxt < len(prompts) or engine.has_work()) and step < cfg.max_loop_steps:
                while nxt < len(prompts) and (arrivals[nxt] <= step or not engine.has_work()):
                    ids.append(engine.add_request(prompts[nxt], max_new[nxt], cfg.request_sampling(nxt)))
                    nxt += 1
                if cfg.reload_at is not None and step == cfg.reload_at and (
                        rank is None or rank == world_size - 1):
                    _reload_from(engine, cfg.reload_config, f"--reload-at {step}")
                before = engine.tokens_generated
                for rid in engine.step():
                    taken[rid] = _take(engine, rid)
                if bar is not None:
                    bar.update(engine.tokens_generated - before)
                step += 1
                if ready is None and engine.worker.capture.ready():
                    ready = (step, time.perf_counter(), engine.tokens_generated)
            loop_s = time.perf_counter() - start  # without writing the trace
    except KeyboardInterrupt:  # Ctrl-C: stop serving, report what finished
        interrupted, loop_s = True, time.perf_counter() - start
    finally:
        # no capture unit starts after the loop; one in progress gets CLOSE_TIMEOUT_S (a hung
        # unit cannot keep the report waiting: it is left behind, reported, beside greedy)
        capture_stopped = engine.close(timeout_s=CLOSE_TIMEOUT_S)
        if bar is not None:
            bar.close()
        quiet_bar.close()
        if reload_signal is not None:
            reload_signal.detach()  # later signals are logged and ignored
    return _LoopRun(ids, taken, step, ready, start, loop_s, interrupted, prof, capture_stopped, _rss_mib() - rss1)


def _loop_report(engine: SpecDecodeEngine, run: _LoopRun, models: dict[str, str],
                 max_new: list[int]) -> dict[str, Any]:
    """The loop's figures, from the engine's stats after it."""
    ids, loop_s, start = run.ids, run.loop_s, run.start
    st = engine.stats()
    report: dict[str, Any] = {
        "models": models, "requests": len(ids),
        "requests_failed": st["requests_failed"], "loop_steps": run.steps, "requested_tokens": sum(max_new[:len(ids)]),
        "tokens_generated": st["tokens_generated"], "loop_s": loop_s,
        "tokens_per_s": st["tokens_generated"] / loop_s if loop_s else 0.0,
        "accept_length_mean": st["accept_length_mean"], "verify_steps": st["verify_steps"],
        "drafts": st["drafts"], "draft_tokens": st["draft_tokens"],
        "accepted_tokens": st["accepted"], "accepted_per_pos": st["accepted_per_pos"],
        "steps_per_state": st["steps_per_state"], "schedule": st["schedule"], "payoff": st.get("payoff"),
        "graph_replays": st["graph_replays"],
        "eager_fallbacks": st["eager_fallbacks"], "eager_steps": st["eager_steps"],
        "fast_path_hits": st["fast_path_hits"], "batch_sizes": st["batch_sizes"], "phases": st["phases"],
        "pad_rows": engine.worker.state.stats.pad_rows, **engine.startup(),
        "capture": engine.capture,
        **_before_after_ready(run.ready, start, start + loop_s, st["tokens_generated"]),
        "reloads": st["reloads"], "worker": st["worker"], "stage_s": st["stage_s"],
        "spec": st["spec"], "backend": engine.worker.state.graphs.backend_name
        if engine.worker.state.graphs is not None else "eager",
    }
    return report


def _with_baselines(report: dict[str, Any], cfg: SimulationConfig, engine: SpecDecodeEngine, run: _LoopRun,
                    outs: list[list[int]], load: _Workload, work: _Arrivals,
                    rank: int | None, reload_signal: ProcessReloadSignal | None) -> dict[str, Any]:
    """``report`` with the profile, the coordinator's figures, how the loop ended, and the eager
    and greedy baselines over the same requests (those that arrived; ``outs``: their outputs)."""
    ids, interrupted = run.ids, run.interrupted
    max_new, arrivals = work.max_new, work.steps
    target, draft, prompts = load.target, load.draft, load.prompts
    if run.profile is not None:
        report["profile"] = run.profile
    if engine.coordinator is not None:
        report["served_generations"] = engine.served
        report["coordinator"] = engine.coordinator.stats.as_dict()
    report["interrupted"] = interrupted
    report["capture_stopped"] = run.capture_stopped
    if reload_signal is not None:
        report["sighup"] = reload_signal.as_dict()
    if cfg.eager_baseline and capabilities(cfg.backend).captures and rank is None and not interrupted:
        report.update(_eager_baseline(cfg, target, draft, prompts[:len(ids)], max_new[:len(ids)],
                                      arrivals[:len(ids)], outs, report["tokens_per_s"], load.eos_id))
    if cfg.greedy and not interrupted:
        report.update(_greedy_baseline(target, prompts[:len(ids)], max_new[:len(ids)], outs,
                                       cfg.args.max_running_requests or 8, cfg.request_sampling, load.eos_id))
        if report["greedy_tokens_per_s"]:
            report["speedup"] = report["tokens_per_s"] / report["greedy_tokens_per_s"]
        if report["greedy_interrupted"]:  # Ctrl-C in the baseline: the report of what ran
            report["interrupted"] = True
    return report


def _before_after_ready(ready: tuple[int, float, int] | None, start: float, end: float,
                        tokens: int) -> dict[str, Any]:
    """Loop tokens/s before and after every graph was ready (None where there is no such part)."""
    if ready is None:
        return {"graphs_ready_step": None, "tokens_per_s_before_ready": None, "tokens_per_s_after_ready": None}
    step, at, done = ready
    before = done / (at - start) if at > start else None
    after = (tokens - done) / (end - at) if end > at and tokens > done else None
    return {"graphs_ready_step": step, "tokens_per_s_before_ready": before, "tokens_per_s_after_ready": after}


def _eager_baseline(cfg: SimulationConfig, target: Any, draft: Any, prompts: list[list[int]],
                    max_new: list[int], arrivals: list[int], outs: list[list[int]],
                    graphs_tokens_per_s: float, eos_id: int | None = None) -> dict[str, Any]:
    """The same requests, arriving at the same steps, through an engine on the eager backend (the
    same args and adaptive candidates): the loop's tokens/s without graphs, measured in the same
    run (``eager_tokens_per_s``, ``vs_eager`` = the loop's over it) and its outputs against the
    loop's (``eager_identical``). Ctrl-C ends it: no figures."""
    engine = SpecDecodeEngine(cfg.args, target, draft, backend="eager", eos_id=eos_id,
                              adaptive_steps=cfg.adaptive_steps or None, acceptance_watch=None)
    ids: list[int] = []
    taken: dict[int, list[int]] = {}
    nxt = step = 0
    try:
        start = time.perf_counter()
        while (nxt < len(prompts) or engine.has_work()) and step < cfg.max_loop_steps:
            while nxt < len(prompts) and (arrivals[nxt] <= step or not engine.has_work()):
                ids.append(engine.add_request(prompts[nxt], max_new[nxt], cfg.request_sampling(nxt)))
                nxt += 1
            for rid in engine.step():
                taken[rid] = _take(engine, rid)
            step += 1
        seconds = time.perf_counter() - start
    except KeyboardInterrupt:
        return {"eager_tokens_per_s": None, "vs_eager": None, "eager_identical": None}
    got = [taken[i] if i in taken else _take(engine, i) for i in ids]
    rate = engine.tokens_generated / seconds if seconds > 0 else 0.0
    return {"eager_tokens_per_s": rate, "vs_eager": graphs_tokens_per_s / rate if rate else None,
            "eager_identical": got == outs}


def _greedy_baseline(target: Any, prompts: list[list[int]], max_new: list[int],
                     outs: list[list[int]], batch: int, sampling: Any = None,
                     eos_id: int | None = None) -> dict[str, Any]:
    """Target-only greedy on the same requests, in arrival order, ``batch`` at a time (with
    ``sampling(i)`` giving request i's `SamplingParams`: the plain sampled run, `sampled_generate`).

    ``lossless``: every output equals greedy's whole output; ``lossless_prefix``: every output
    is a prefix of greedy's (what a run cut by ``--max-loop-steps`` can show: its unfinished
    requests hold fewer tokens); ``outputs_cut``: the outputs shorter than asked (not counting
    those that ended at ``eos_id``: greedy's output is cut after its first eos too). Ctrl-C in the
    baseline ends it: the figures cover the groups compared (``greedy_compared``) and
    ``greedy_interrupted`` is True."""
    start = time.perf_counter()
    same = prefix = True
    tokens = compared = 0
    interrupted = False
    try:
        for i in range(0, len(prompts), batch):
            group = range(i, min(i + batch, len(prompts)))
            params = [sampling(j) if sampling is not None else None for j in group]
            args = (target, [prompts[j] for j in group], max(max_new[j] for j in group))
            ref = (greedy_generate(*args, eos_id) if all(p is None for p in params)
                   else sampled_generate(*args, [p or GREEDY for p in params], eos_id=eos_id))
            for j, r in zip(group, ref):
                r = r[:max_new[j]]
                tokens += len(r)
                compared += 1
                same &= r[:max_new[j]] == outs[j]
                prefix &= r[:len(outs[j])] == outs[j]
    except KeyboardInterrupt:
        interrupted = True
    s = time.perf_counter() - start
    cut = sum(len(o) < m and not (o and o[-1] == eos_id) for o, m in zip(outs[:compared], max_new))
    return {"greedy_s": s, "greedy_tokens_per_s": tokens / s if tokens and s > 0 else 0.0,
            "lossless": same if compared else None, "lossless_prefix": prefix if compared else None,
            "outputs_cut": cut, "greedy_compared": compared, "greedy_interrupted": interrupted}


def rank_simulation(rank: int, world_size: int, cfg: SimulationConfig, reloads: Any = None) -> dict[str, Any]:
    """One rank of `draftgraph simulate --world-size N` (run by `spawn_ranks`); the greedy
    baseline runs on rank 0 only. ``reloads``: the launcher's queue of SIGHUP reloads, taken by
    rank 0 (`rank_reloads`)."""
    import dataclasses
    if rank != 0:
        cfg = dataclasses.replace(cfg, greedy=False)
    relay = None
    if reloads is not None and rank == 0:
        from .rank_reloads import RankReloads
        relay = RankReloads(reloads)
    return run_simulation(cfg, sighup=None, rank=rank, world_size=world_size, reload_signal=relay)
