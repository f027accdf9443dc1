"""SGLang 0.5.23 drop-in: stable chain buffers (and a keyed fast path) for SGLang's draft workers.

SGLang's ``EagleDraftWorkerBase._rebuild_topk1_chain_buffers`` allocates new tensors on every
call, so after ``_override_worker_state`` (rebuild for S', then rebuild for S) the worker holds
other tensors than those a graph captured before the override baked in; on CUDA that graph then
reads freed memory. `install_chain_buffers` patches one worker instance so that the rebuild takes
its tensors from draftgraph's chain-buffer cache: the same (S, capacity, device) gives the very
same tensors. For ``MultiLayerEagleDraftWorker`` it also replaces ``draft_forward`` with
draftgraph's key check (buffers built for the current S, S columns, b <= capacity), falling back
to SGLang's own ``_draft_forward_organize``. Nothing in SGLang is imported at module level; the
one import, SGLang's ``maybe_detect_nan`` (`_sglang_nan_check`), happens only for a worker whose
class comes from sglang, when sglang is loaded already. `runtime_args_from_sglang` lives in
`draftgraph.runtime.sglang.config`.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import torch

from draftgraph.graphs import span
from draftgraph.runtime.topology.chain import ChainBuffers, chain_fast_views
from draftgraph.runtime.worker import DraftCounters

from ..validation import require_positive_int
from .config import published_server_args, sglang_chain_capacity

__all__ = ["AdoptedChain", "SGLangChainHandle", "SGLangDraftWorker", "install_chain_buffers"]

logger = logging.getLogger(__name__)

_HANDLE_ATTR = "_draftgraph_chain_handle"
_REBUILD = "_rebuild_topk1_chain_buffers"
_FORWARD = "draft_forward"
_MISSING = object()


@runtime_checkable
class SGLangDraftWorker(Protocol):
    """What the adapter reads of the SGLang draft worker it patches (SGLang's own worker, not a
    draftgraph one, so draftgraph's `DraftWorker` contract does not apply). Besides these it
    replaces ``_rebuild_topk1_chain_buffers`` (and, for the multi-layer worker, ``draft_forward``,
    falling back to ``_draft_forward_organize``) and writes ``_topk1_parents_prealloc`` /
    ``_topk1_score_indices_prealloc``: SGLang's names, checked at install."""

    topk: int
    """k of the draft (the chain's fast path needs 1)."""
    speculative_num_steps: int
    """S, read at every rebuild and step."""
    speculative_num_draft_tokens: int
    """N (a chain needs S + 1)."""
    device: Any
    """Where the chain buffers live."""
    server_args: Any
    """The capacity's source when SGLang published no server args."""


def install_chain_buffers(worker: SGLangDraftWorker) -> SGLangChainHandle:
    """Patch one SGLang draft worker (an ``EagleDraftWorkerBase`` subclass) in place.

    Call it on the draft worker (``EAGLEWorkerV2._draft_worker`` / ``draft_worker``); tensors the
    worker already holds are adopted when they are the chain constants, so graphs captured before
    the install keep theirs. Installing twice is a ValueError; ``handle.uninstall()`` undoes it.
    """
    if not callable(getattr(worker, _REBUILD, None)):
        raise TypeError(
            f"worker={type(worker).__name__}: not an SGLang draft worker (no {_REBUILD}); pass the "
            f"draft worker, e.g. EAGLEWorkerV2._draft_worker"
        )
    if getattr(worker, _HANDLE_ATTR, None) is not None:
        raise ValueError(f"worker={type(worker).__name__}: draftgraph chain buffers already installed")
    return SGLangChainHandle(worker)


class AdoptedChain:
    """One (S, capacity, device) set of chain tensors the worker was given, with cached row views.

    Either draftgraph's `ChainBuffers` (``owner``, kept alive with its tensors) or tensors SGLang
    had already built with exactly the same contents (adopted at install, ``owner`` None).
    """

    __slots__ = ("num_steps", "capacity", "device", "parents", "score_indices", "owner", "_views")

    def __init__(self, parents: torch.Tensor, score_indices: torch.Tensor, num_steps: int,
                 owner: ChainBuffers | None = None) -> None:
        self.num_steps, self.capacity, self.device = num_steps, parents.shape[0], parents.device
        self.parents, self.score_indices, self.owner = parents, score_indices, owner
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def key(self) -> tuple[int, int, str]:
        """(S, capacity, device) identity."""
        return (self.num_steps, self.capacity, str(self.device))

    def view(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(parents[:bs], score_indices[:bs]) for 1 <= bs <= capacity, cached per bs (constants)."""
        found = self._views.get(bs)
        if found is None:
            found = self._views[bs] = (self.parents[:bs], self.score_indices[:bs])
        return found


class SGLangChainHandle:
    """What `install_chain_buffers` changed on one worker; counters; `uninstall`.

    Holds every ChainBuffers the worker was given until uninstall: a graph captured on any of them
    may still be alive, and they are few (one per distinct S at one capacity).
    """

    def __init__(self, worker: SGLangDraftWorker) -> None:
        self.worker = worker
        self.counters = DraftCounters()
        self.active: AdoptedChain | None = None
        self._held: dict[tuple[int, int, str], AdoptedChain] = {}
        self._nan_check = _sglang_nan_check(worker)
        names = [_REBUILD] + ([_FORWARD] if _is_multi_layer(worker) else [])
        self._saved = {name: vars(worker).get(name, _MISSING) for name in names}
        self._patches = {_REBUILD: self.rebuild, _FORWARD: self.draft_forward}  # bound once
        self._adopt_or_rebuild()
        for name in names:
            setattr(worker, name, self._patches[name])
        setattr(worker, _HANDLE_ATTR, self)

    @property
    def installed(self) -> bool:
        """True until `uninstall`."""
        return getattr(self.worker, _HANDLE_ATTR, None) is self

    @property
    def patched(self) -> tuple[str, ...]:
        """Names of the worker methods this handle replaced."""
        return tuple(self._saved)

    def uninstall(self) -> None:
        """Give the worker SGLang's own methods back; the tensors it holds stay (they are valid)."""
        if not self.installed:
            raise ValueError(f"worker={type(self.worker).__name__}: this handle is not installed")
        state = vars(self.worker)
        for name in self._saved:
            if state.get(name) is not self._patches[name]:
                raise ValueError(
                    f"worker.{name} was replaced after install_chain_buffers; refusing to overwrite it"
                )
        for name, previous in self._saved.items():
            if previous is _MISSING:
                del state[name]
            else:
                state[name] = previous
        del state[_HANDLE_ATTR]

    # ---- buffers ---------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Point the worker at the chain buffers of its current (S, capacity, device).

        Does what SGLang's rebuild does (nothing unless topk == 1), but the same key returns the
        same tensors. N != S + 1 with topk == 1 is a ValueError and changes nothing.
        """
        w = self.worker
        if w.topk != 1:
            self.active = None  # SGLang leaves its attributes as they are; the fast path stops here
            return
        s = require_positive_int("speculative_num_steps", w.speculative_num_steps)
        n = w.speculative_num_draft_tokens
        if n != s + 1:
            raise ValueError(
                f"speculative_num_draft_tokens={n!r} with topk=1 and speculative_num_steps={s}: a "
                f"chain needs speculative_num_draft_tokens == speculative_num_steps + 1 = {s + 1}"
            )
        capacity = sglang_chain_capacity(self._config_source())
        with span("rebuild", num_steps=s, capacity=capacity):
            buf = self._buffers_for(s, capacity, w.device)
            # SGLang's own buffer attributes: installing ours there is this adapter's job
            w._topk1_parents_prealloc = buf.parents  # noqa: SLF001
            w._topk1_score_indices_prealloc = buf.score_indices  # noqa: SLF001
            self.active = buf
            self.counters.rebuilds += 1

    def _buffers_for(self, num_steps: int, capacity: int, device: Any) -> AdoptedChain:
        """The held set for (S, capacity, device), built once as draftgraph's ChainBuffers."""
        key = (num_steps, capacity, str(torch.device(device)))
        found = self._held.get(key)
        if found is None:
            built = ChainBuffers(num_steps, capacity, device)
            found = self._held[key] = AdoptedChain(built.parents, built.score_indices, num_steps, built)
        return found

    def _config_source(self) -> Any:
        """None (the published context) when SGLang published one, else the worker's server_args."""
        return None if published_server_args() is not None else self.worker.server_args

    def _adopt_or_rebuild(self) -> None:
        """Adopt the worker's current chain tensors when they are exactly the constants, else rebuild."""
        w = self.worker
        parents = getattr(w, "_topk1_parents_prealloc", None)
        indices = getattr(w, "_topk1_score_indices_prealloc", None)
        if w.topk != 1 or parents is None or indices is None:
            self.rebuild()
            return
        s = w.speculative_num_steps
        shaped = parents.dim() == 2 and parents.shape[0] >= 1 and isinstance(s, int) and s >= 1
        expected = ChainBuffers(s, parents.shape[0], parents.device) if shaped else None
        if (expected is None or parents.shape != expected.parents.shape
                or indices.shape != expected.score_indices.shape or indices.device != parents.device
                or not torch.equal(parents, expected.parents)
                or not torch.equal(indices, expected.score_indices)):
            logger.info("worker's chain tensors are not the constants for S=%s; rebuilding", s)
            self.rebuild()
            return
        if parents.shape[0] != sglang_chain_capacity(self._config_source()):
            self.rebuild()
            return
        adopted = AdoptedChain(parents, indices, s)
        self.active = self._held[adopted.key] = adopted

    # ---- draft_forward (multi-layer) ---------------------------------------------------------
    def draft_forward(self, forward_batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(parent_list [b, S or 0], top_scores_index [b, S], draft_tokens [b, S]) as SGLang returns.

        Fast path when the active buffers were built for the worker's current S, topk_index has
        S columns and b <= capacity; otherwise SGLang's own ``_draft_forward_organize``.
        """
        w = self.worker
        spec_info = forward_batch.spec_info
        topk_p, topk_index = spec_info.topk_p, spec_info.topk_index
        if self._nan_check is not None:
            self._nan_check(topk_p, "draft_forward: NaN in initial topk_p from spec_info")
        s = w.speculative_num_steps
        b, width = topk_index.shape[0], topk_index.shape[-1]
        # self.active is read once: a concurrent rebuild cannot mix two buffer sets
        views = chain_fast_views(self.active, s, width, b, self.counters)
        if views is not None:
            return views[0], views[1], topk_index
        self.counters.tree_path_calls += 1
        with span("organize_tree", bs=b, num_steps=s):
            return w._draft_forward_organize(topk_p, topk_index, spec_info.hidden_states)  # noqa: SLF001  # SGLang's


def _is_multi_layer(worker: Any) -> bool:
    """SGLang's MultiLayerEagleDraftWorker (or a subclass): its draft_forward only organizes."""
    return any(c.__name__ == "MultiLayerEagleDraftWorker" for c in type(worker).__mro__) and callable(
        getattr(worker, "_draft_forward_organize", None)
    )


def _sglang_nan_check(worker: Any) -> Any:
    """SGLang's ``maybe_detect_nan`` (its draft_forward calls it first) for an SGLang worker, else None.

    Imported only when the worker's class comes from sglang (then sglang is loaded already).
    """
    if not any(c.__module__.split(".", 1)[0] == "sglang" for c in type(worker).__mro__):
        return None
    try:
        from sglang.srt.utils.async_probe import maybe_detect_nan
    except ImportError:
        return None
    return maybe_detect_nan
