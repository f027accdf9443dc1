"""tree_choices: every validation rule with its message (also under python -O), args file, CLI form."""

from __future__ import annotations

import json

import pytest

from draftgraph.runtime.args_file import load_runtime_args
from draftgraph.runtime.config import SpeculativeConfig
from draftgraph.runtime.tree_choices import parse_tree_choices
from draftgraph.runtime.validation import ConfigTypeError

TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))

TREE_CASES = [
    # (kwargs, exception, message fragment)
    (dict(num_steps=2, topk=2, tree_choices="01"), ConfigTypeError,
     "tree_choices='01': must be a sequence of paths"),
    (dict(num_steps=2, topk=2, tree_choices=[(0,), 1]), ConfigTypeError,
     "tree_choices[1]=1: must be a path, a sequence of int child ranks"),
    (dict(num_steps=2, topk=2, tree_choices=[(0,), (0, 1.0)]), ConfigTypeError,
     "tree_choices[1]=(0, 1.0): rank 1.0 (float) must be an int"),
    (dict(num_steps=1, topk=2, tree_choices=[(True,)]), ConfigTypeError,
     "rank True (bool) must be an int"),
    (dict(num_steps=1, topk=2, tree_choices=[]), ValueError, "tree_choices=(): needs at least one path"),
    (dict(num_steps=1, topk=2, tree_choices=[(0,), ()]), ValueError,
     "tree_choices[1]=(): a path needs at least one rank"),
    (dict(num_steps=2, topk=2, tree_choices=[(0,), (0, 2)]), ValueError,
     "tree_choices[1]=(0, 2): rank 2 must be in [0, topk=2)"),
    (dict(num_steps=2, topk=2, tree_choices=[(0,), (-1,)]), ValueError,
     "tree_choices[1]=(-1,): rank -1 must be in [0, topk=2)"),
    (dict(num_steps=2, topk=2, tree_choices=[(0,), (0, 0), (0,)]), ValueError,
     "tree_choices[2]=(0,): duplicate of tree_choices[0]"),
    (dict(num_steps=3, topk=2, tree_choices=[(0,), (0, 1, 0), (0, 0)]), ValueError,
     "tree_choices[1]=(0, 1, 0): its prefix (0, 1) is missing"),
    (dict(num_steps=2, topk=2, tree_choices=[(0,), (0, 0), (0, 0, 0)]), ValueError,
     "tree_choices[2]=(0, 0, 0): depth 3 exceeds num_steps=2"),
    (dict(num_steps=3, topk=2, tree_choices=[(0,), (1,), (0, 0)]), ValueError,
     "the deepest path has depth 2, must equal num_steps=3"),
    (dict(num_steps=3, topk=2, num_draft_tokens=6, tree_choices=TREE), ValueError,
     "num_draft_tokens=6 with 6 tree_choices: must equal len(tree_choices) + 1 = 7"),
    (dict(num_steps=3, topk=2, num_draft_tokens=7.0, tree_choices=TREE), ConfigTypeError,
     "num_draft_tokens=7.0 (float): must be an int"),
    (dict(num_steps=2, topk=1, tree_choices=[(0,), (0, 0), (1,)]), ValueError,
     "tree_choices[2]=(1,): rank 1 must be in [0, topk=1)"),
]


@pytest.mark.parametrize("kwargs,exc,fragment", TREE_CASES)
def test_tree_choices_rules(kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        SpeculativeConfig(**kwargs)
    assert fragment in str(info.value)


def test_static_tree_config_is_normalized_and_derives_n():
    shuffled = [list(p) for p in reversed(TREE)]
    spec = SpeculativeConfig(3, 2, tree_choices=shuffled)
    assert spec.tree_choices == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert spec.num_draft_tokens == 7 and spec.is_static and not spec.is_chain
    assert spec == SpeculativeConfig(3, 2, 7, TREE) and hash(spec) == hash(SpeculativeConfig(3, 2, 7, TREE))
    assert spec.layout_topk == 1 and SpeculativeConfig(3, 2, 8).layout_topk == 2
    # a static tree may exceed the dynamic tree's candidate bound k + (S-1) k^2 = 10
    full = [(a,) for a in range(2)] + [(a, b) for a in range(2) for b in range(2)] + \
        [(a, b, c) for a in range(2) for b in range(2) for c in range(2)]
    assert SpeculativeConfig(3, 2, tree_choices=full).num_draft_tokens == 15


def test_chain_spellings_are_one_config():
    chain = SpeculativeConfig(3, 1)
    spelled = SpeculativeConfig(3, 1, tree_choices=[[0], [0, 0], [0, 0, 0]])
    assert spelled == chain and spelled.tree_choices is None and hash(spelled) == hash(chain)
    assert spelled.topology == chain.topology and chain.topology.choices == ((0,), (0, 0), (0, 0, 0))
    # topk > 1 with chain-shaped choices is a static tree: another config, the same topology
    shaped = SpeculativeConfig(3, 2, tree_choices=[[0], [0, 0], [0, 0, 0]])
    assert shaped != chain and shaped.topology == chain.topology and shaped.num_draft_tokens == 4
    assert SpeculativeConfig(3, 2, 8).topology is None  # dynamic


def test_static_tree_depth_is_fixed():
    spec = SpeculativeConfig(3, 2, tree_choices=TREE)
    assert spec.with_steps(3) is spec
    with pytest.raises(ValueError, match="static tree's depth is set by its tree_choices"):
        spec.with_steps(4)


def test_parse_tree_choices_cli_forms():
    assert parse_tree_choices("[[0], [1], [0, 0]]") == ((0,), (1,), (0, 0))
    assert parse_tree_choices("((0,), (1,), (0, 0))") == ((0,), (1,), (0, 0))
    with pytest.raises(ValueError, match="not a list of paths"):
        parse_tree_choices("[[0], [1")
    with pytest.raises(ConfigTypeError, match=r"tree_choices\[0\]=0: must be a path"):
        parse_tree_choices("[0, 1]")


def test_args_file_json_and_toml(tmp_path):
    j = tmp_path / "tree.json"
    j.write_text(json.dumps({"speculative": {"num_steps": 3, "topk": 2, "tree_choices": TREE},
                             "cuda_graph_config": {"decode": {"bs": [1, 2]}}}))
    a = load_runtime_args(j)
    assert a.speculative.tree_choices == TREE and a.speculative.num_draft_tokens == 7
    t = tmp_path / "tree.toml"
    t.write_text("[speculative]\nnum_steps = 2\ntopk = 3\ntree_choices = [[0], [2], [0, 1]]\n")
    assert load_runtime_args(t).speculative.tree_choices == ((0,), (2,), (0, 1))
    j.write_text(json.dumps({"speculative": {"num_steps": 3, "topk": 2,
                                             "tree_choices": [[0], [0, 1, 0], [0, 0]]}}))
    with pytest.raises(ValueError, match=r"tree.json.*tree_choices\[1\]=\(0, 1, 0\): its prefix"):
        load_runtime_args(j)


def test_tree_rules_survive_python_O(python_O):
    checked = python_O.rules("test_tree_choices", {"draftgraph.runtime.config.SpeculativeConfig": "TREE_CASES"})
    assert checked == len(TREE_CASES)


@pytest.mark.parametrize("text,where", [("not json", "column 1"), ("[[0], [1", "column 9"),
                                        ("[[0]] + [[1]]", "column 7"), ("-x", "column 1")])
def test_parse_tree_choices_error_names_the_text_and_the_form(text, where):
    with pytest.raises(ValueError) as info:
        parse_tree_choices(text)
    message = str(info.value)
    assert message.startswith(f"tree_choices={text!r}: not a list of paths")
    assert "JSON or a Python literal" in message and "[[0], [1], [0, 0]]" in message and where in message
    assert "<ast." not in message and " at 0x" not in message and "object" not in message


def test_parse_tree_choices_error_shortens_a_long_text():
    with pytest.raises(ValueError) as info:
        parse_tree_choices("(" * 100_000)
    assert len(str(info.value)) < 400 and "..." in str(info.value)
