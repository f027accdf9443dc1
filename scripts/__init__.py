"""draftgraph's benchmarks and tools, run from the repository root as modules:
``python -m scripts.NAME --help`` (see docs/performance.md)."""
