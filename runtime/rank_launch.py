"""Earlier import path of the CPU rank launcher; the code lives in `draftgraph.runtime.ranks.launch`
(`spawn_ranks` is also exported by `draftgraph.runtime`)."""

from __future__ import annotations

from .ranks.launch import RankLaunchError, spawn_ranks

__all__ = ["RankLaunchError", "spawn_ranks"]
