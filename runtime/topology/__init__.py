"""Tree math and its constants: the chain, organize, static tree choices, the verify tree, the
topology buffers a static layout keeps on its device, and the per-row draft state's forms.

The wing's face: the names other wings use, each defined in the module named beside it.
"""

from draftgraph.runtime.tree_choices import (
    Choices,
    StaticTopology,
    chain_choices,
    check_tree_choices,
    parse_tree_choices,
)

from .buffers import Selector, TopologyBufferCache, TopologyBuffers, VerifyConstants
from .chain import ChainBuffers, chain_fast_views
from .draft_rows import DraftRowsLike, RowLayout, leaves, map_rows, named_leaves, row_count
from .organize import fast_topk, organize_chain_steps, organize_draft_results, select_top_k_tokens
from .verify_tree import VerifyTree, build_tree

__all__ = ["ChainBuffers", "Choices", "DraftRowsLike", "RowLayout", "Selector", "StaticTopology",
           "TopologyBufferCache", "TopologyBuffers", "VerifyConstants", "VerifyTree", "build_tree", "chain_choices",
           "chain_fast_views", "check_tree_choices", "fast_topk", "leaves", "map_rows", "named_leaves",
           "organize_chain_steps", "organize_draft_results", "parse_tree_choices", "row_count", "select_top_k_tokens"]
