"""Compiling off the serving process's interpreter lock: one spawned process runs inductor.

Inductor's code generation is Python: run in a thread beside serving, it holds the GIL for
seconds per graph and serving waits at every torch op (measured on 2 cores: the demo's loop
fell from 1,669 to 74-190 tokens/s). `CompileWorker.compile` sends the recorded,
constant-lifted aten graph (node for node, as plain data: `graph_wire`; no tensors) and the
shapes, strides and dtypes of its inputs to a process of its own, which compiles it
(``standalone_compile``, specialized on those shapes, over zero-filled stand-ins: the values
never reach the code; or once with a symbolic batch dimension, over fake inputs, for
`compile_symbolic`) and returns the artifact's bytes; the caller loads them
(`inductor.load_artifact`, milliseconds) and checks the result bitwise as it checks
an in-process compile. The process (`serve` run by ``python -c``, length-prefixed pickles
over its stdin and stdout: a private pipe) is started on first use (it imports torch and
inductor once), reused, and runs at a lower priority; it uses the same inductor cache folder.
When it dies the call raises `CompileWorkerDied` (the caller's size stays eager, counted) and
the next call starts a new one. ``compile_s`` sums the seconds spent compiling in the process.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import torch
from torch import Tensor, fx

from ..core.graph_wire import graph_from_wire, graph_to_wire
from .inductor import artifact_bytes, compile_symbolic, inductor_artifact

__all__ = ["CompileWorker", "CompileWorkerDied", "serve"]

logger = logging.getLogger(__name__)


class CompileWorkerDied(RuntimeError):
    """The compile process ended before answering (killed, out of memory, crashed)."""


def _meta(t: Tensor) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    return tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch.")


def _symbolic_inputs(gm: fx.GraphModule, metas: list[tuple[tuple[int, ...], tuple[int, ...], str]], dynamic: int
                     ) -> tuple[fx.GraphModule, list[Tensor]]:
    """``gm`` traced again over fake inputs shaped by ``metas``, dim 0 of the first ``dynamic``
    symbolic (one `ShapeEnv`): the rebuilt graph carries no node metadata, and a compile
    ``from_graph`` reads its symbols from there; (the traced graph, its fake inputs)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    mode.cache_enabled = False  # a process-wide cache: entries of each compile would stay
    fakes = []
    for i, (shape, stride, dtype) in enumerate(metas):
        like = torch.empty_strided(shape, stride, dtype=getattr(torch, dtype))
        dims = [DimDynamic.DYNAMIC if i < dynamic and d == 0 else DimDynamic.STATIC for d in range(len(shape))]
        fakes.append(mode.from_tensor(like, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)))
    with mode:
        traced = make_fx(gm, tracing_mode="fake", _allow_non_fake_inputs=True)(*fakes)
    return traced, fakes


def _compile_in_child(graph: list[tuple[Any, ...]], metas: list[tuple[tuple[int, ...], tuple[int, ...], str]],
                      threads: int, dynamic: int = 0) -> tuple[bytes, float]:
    """In the compile process: (artifact bytes, seconds). ``threads``: the parent's intra-op
    threads (inductor's CPU code depends on it, and so does its cache key: the same count
    makes the same code and shares the parent's cache entries). ``dynamic`` > 0: dim 0 of the
    first ``dynamic`` inputs is symbolic, one compile for every batch size (`symbolic`)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    gm = graph_from_wire(graph)
    start = time.perf_counter()
    with torch.no_grad():
        if dynamic:
            traced, fakes = _symbolic_inputs(gm, metas, dynamic)
            artifact = compile_symbolic(traced, fakes)
        else:
            inputs = [torch.empty_strided(shape, stride, dtype=getattr(torch, dtype)).zero_()
                      for shape, stride, dtype in metas]
            artifact = inductor_artifact(gm, inputs)
    return artifact_bytes(artifact), time.perf_counter() - start


_LEN = struct.Struct("<Q")
# the compile process's nice level. It is spawned from the capture thread, which already runs at
# nice 10 (`runtime.worker.capture_queue`), and a child inherits that: a further os.nice(10) made it 19,
# and on a loaded machine it then got 2 s of CPU in 47 s (no unit finished in 240 s of serving)
_NICE = 10


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    head = stream.read(_LEN.size)
    if len(head) != _LEN.size:
        raise EOFError("the other end closed the pipe")
    (n,) = _LEN.unpack(head)
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("the other end closed the pipe mid-message")
    return pickle.loads(data)  # noqa: S301  # our own process's pickle, over a private pipe


class _DropNoCudaNotice(logging.Filter):
    """Drops torch's "No CUDA runtime is found, using CUDA_HOME=..." (logged when inductor loads
    its C++ tools on a machine without CUDA): the serving process logged it already, or its
    command dropped it; a copy from each compile process says nothing new."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


def serve() -> None:
    """The compile process's loop: one request in (stdin), one answer out (stdout), until EOF."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever inductor prints must not corrupt the answers
    if not torch.cuda.is_available():
        logging.getLogger("torch.utils.cpp_extension").addFilter(_DropNoCudaNotice())
    with contextlib.suppress(OSError, AttributeError):  # serving comes first: nice 10, not more
        os.nice(max(0, _NICE - os.getpriority(os.PRIO_PROCESS, 0)))
    for name in ("torch._dynamo", "torch._inductor.compile_fx"):  # imported as in a parent that compiles
        importlib.import_module(name)
    while True:
        try:
            graph, metas, threads, dynamic = _receive(sys.stdin.buffer)
        except EOFError:
            return
        try:
            answer = ("ok", *_compile_in_child(graph, metas, threads, dynamic))
        except Exception as exc:  # inductor's error goes back to the caller, the process goes on
            answer = ("error", f"{type(exc).__name__}: {exc}", 0.0)
        _send(out, answer)


class CompileWorker:
    """A reusable compile process (see the module docstring). Thread-safe (one compile at a time)."""

    def __init__(self, cache_dir: str | None = None) -> None:
        self._cache_dir = cache_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closing = False  # close() ends the process for good: a compile cut off then is no death
        self.compiles = 0
        self.deaths = 0
        self.compile_s = 0.0

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the draftgraph this process runs
        if self._cache_dir:
            env["TORCHINDUCTOR_CACHE_DIR"] = self._cache_dir
        code = "from draftgraph.graphs.compile.worker import serve; serve()"
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def compile(self, gm: fx.GraphModule, inputs: tuple[Tensor, ...] | list[Tensor], dynamic: int = 0) -> bytes:
        """The saveable artifact bytes of ``gm`` compiled for inputs shaped like ``inputs`` (only
        their shapes, strides and dtypes travel: "meta" tensors will do); ``dynamic`` > 0: one
        compile with dim 0 of the first ``dynamic`` inputs symbolic (their dim 0 is the example
        size, >= 2). `CompileWorkerDied` when the process ended; inductor's own errors raise
        RuntimeError."""
        if not isinstance(dynamic, int) or isinstance(dynamic, bool) or not 0 <= dynamic <= len(inputs):
            raise ValueError(f"dynamic={dynamic!r}: must be an int from 0 to the {len(inputs)} inputs")
        request = (graph_to_wire(gm), [_meta(t) for t in inputs], torch.get_num_threads(), dynamic)
        with self._lock:
            if self._closing:  # closed for good: a unit recorded after close() must not start a new one
                raise CompileWorkerDied("the compile process was closed")
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            try:
                _send(proc.stdin, request)
                status, payload, seconds = _receive(proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                self._proc = None
                with contextlib.suppress(OSError):
                    proc.kill()
                code = proc.wait()
                if self._closing:
                    raise CompileWorkerDied("the compile process was closed") from exc
                self.deaths += 1
                logger.warning("compile process died (exit %s: %s); the next compile starts a new one", code, exc)
                raise CompileWorkerDied(f"the compile process died (exit {code})") from exc
        if status != "ok":
            raise RuntimeError(f"compile process: {payload}")
        self.compiles += 1
        self.compile_s += seconds
        return payload

    def pid(self) -> int | None:
        """The compile process's id (None before the first compile or after it died)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def closed(self) -> bool:
        """True once `close` was called: a request then fails because of the close, not a death."""
        return self._closing

    def close(self) -> None:
        """End the compile process for good: a compile in progress raises `CompileWorkerDied`
        at once (the process is killed) and so does every later one (before, a unit still
        recording when the capture stopped started a new process and compiled on after the
        engine's close)."""
        self._closing = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
                proc.kill()
            proc.wait()

    def as_dict(self) -> dict[str, Any]:
        """Counts and seconds (JSON-ready)."""
        return {"compiles": self.compiles, "deaths": self.deaths, "compile_s": self.compile_s}

