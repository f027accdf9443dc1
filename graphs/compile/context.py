"""What the per-size compile and the symbolic route share within one compile backend.

`CompileContext` holds the compile backend's choices (a custom ``compile_fn`` of a test, a
``compiler`` process, whether a store keeps the code) and the state the two compile routes
update together: the `ModuleLedger` of generated modules and the count of compiles run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .inductor import ModuleLedger
from .worker import CompileWorkerDied

__all__ = ["CompileContext"]


@dataclass
class CompileContext:
    """One backend's compile choices and shared counts (see the module docstring).

    ``compile_fn``: a custom compile (a test's; its code is never stored and the symbolic route
    is off); ``compiler``: a `CompileWorker` or `CompilePool` that runs inductor in another
    process; ``storing``: a store keeps the compiled code (compile saveable artifacts)."""

    compile_fn: Callable[..., Any] | None = None
    compiler: Any = None
    storing: bool = False
    ledger: ModuleLedger = field(default_factory=ModuleLedger)
    compiles: int = 0  # compiles run (symbolic and per size, here or in the compile process)

    @property
    def default_compile(self) -> bool:
        """True when inductor compiles as configured (no custom ``compile_fn``)."""
        return self.compile_fn is None

    def stop_if_closed(self, exc: Exception | None) -> None:
        """Raise `CompileWorkerDied` when the compile process was closed (the engine or the
        process is ending: at exit, loading inductor's code fails with "can't register atexit
        after shutdown"): no compile in this process then, and nothing to warn about."""
        if self.compiler is not None and self.compiler.closed:
            raise CompileWorkerDied("the compile process was closed: no compile in this process") from exc
