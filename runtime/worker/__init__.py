"""Everything that lives and dies with a runtime state: the draft workers, the state and its slot,
capture off the serving path, reload, the memory budget, the counters, adaptive S, weights."""
