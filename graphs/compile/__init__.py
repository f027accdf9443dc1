"""The compile backend's wing: inductor-compiled replays of recorded graphs, checked bitwise.

`backend.CompileBackend` (the backend ``"compile"``) records as the trace backend does and
replays inductor's code per size. Its rooms, one job each: `inductor` (compile, artifact, load,
the module ledger, the cache folder: the names the compile process imports too), `compare` (run
both on copies and compare bitwise), `store_io` (stored code, read and written), `symbolic` (one
compile per step), `per_size` (one compile per size), `speed` ("auto"'s timing), `records`
(`CaptureOutcome`, `CompiledRunner`), `context` (what the routes share), `entry` (the stored
entry format and keys), `worker` and `pool` (compiling in other processes).

The wing's face: the names the rest of draftgraph uses (the backend, its stored code, the
compile processes, whether inductor can run here), each defined in the module named beside it.
"""

from .backend import CompileBackend
from .entry import CompiledStore, StoredCode
from .inductor import compiler_available, inductor_cache_dir
from .pool import CompilePool
from .worker import CompileWorker, CompileWorkerDied

__all__ = ["CompileBackend", "CompilePool", "CompileWorker", "CompileWorkerDied", "CompiledStore", "StoredCode",
           "compiler_available", "inductor_cache_dir"]
