"""The typed seam (issue 48, item 5): the engine takes any target and EAGLE head that have the
members of `DraftTarget` / `DraftHead`, and refuses one that lacks a member when it is built,
with a TypeError naming the member (before: a hasattr probe of two target members, an
isinstance test of the head, and the rest found missing mid-step or never).

The models here are stand-ins that forward every protocol member to the toy pair and nothing
else, so an engine that reached past the protocol would fail on them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from engine_support import MAX_NEW, engine_args, models, prompts, reference

from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.model_seam import DraftHead, DraftTarget, protocol_members

# what the engine calls on each model, written out (the list: the forward, new_cache,
# the hidden-state contract, the vocabulary)
TARGET_MEMBERS = ("cfg", "check_backend", "describe", "device", "dtype", "forward", "hidden_size", "new_cache")
HEAD_MEMBERS = ("allocate_cache", "cache", "cfg", "describe", "device", "dtype", "extend", "forward",
                "initial_state", "row_template", "vocab_size")


def stand_in(model: torch.nn.Module, members: tuple[str, ...], without: str = "",
             **override: Any) -> torch.nn.Module:
    """A module exposing ``members`` of ``model`` (all but ``without``; ``override``: fixed
    values), each read through to ``model``: no other attribute of ``model`` is reachable."""
    body: dict[str, Any] = {}
    for name in members:
        if name == without:
            continue
        if name in override:
            body[name] = property(lambda self, v=override[name]: v)
        elif name == "forward":
            body[name] = lambda self, *a: self.inner(*a)
        else:
            body[name] = property(lambda self, n=name: getattr(self.inner, n))
    module = type(f"StandIn{type(model).__name__}", (torch.nn.Module,), body)()
    module.inner = model
    return module


def _engine(target: Any, head: Any) -> SpecDecodeEngine:
    return SpecDecodeEngine(engine_args(), target, head, backend="eager")


def test_the_protocols_name_what_the_engine_calls():
    assert protocol_members(DraftTarget) == TARGET_MEMBERS
    assert protocol_members(DraftHead) == HEAD_MEMBERS


def test_stand_ins_with_every_member_serve_exactly():
    """Neither an HFTarget nor an EAGLE head class: the engine serves them through the protocols
    alone, and its output is greedy decoding's."""
    target, head = models("eagle")
    engine = _engine(stand_in(target, TARGET_MEMBERS), stand_in(head, HEAD_MEMBERS))
    batch = [list(p) for p in prompts()[:4]]
    assert engine.generate(batch, MAX_NEW) == reference()[:4]
    assert engine.stats()["accept_length_mean"] > 1.0


@pytest.mark.parametrize("member", TARGET_MEMBERS)
def test_a_target_missing_a_member_is_refused_naming_it(member):
    target, head = models("eagle")
    with pytest.raises(TypeError, match=rf"target=StandInHFTarget: lacks '{member}' of the DraftTarget protocol"):
        _engine(stand_in(target, TARGET_MEMBERS, without=member), head)


@pytest.mark.parametrize("member", HEAD_MEMBERS)
def test_a_head_missing_a_member_is_refused_naming_it(member):
    target, head = models("eagle")
    with pytest.raises(TypeError, match=rf"draft=StandInEagle3Head: lacks '{member}' of the DraftHead protocol"):
        _engine(target, stand_in(head, HEAD_MEMBERS, without=member))


def test_a_head_reading_other_features_is_refused_naming_both_widths():
    target, head = models("eagle")
    wide = dataclasses.replace(head.cfg, feature_width=target.hidden_size + 1)
    with pytest.raises(ValueError, match=rf"feature_width={target.hidden_size + 1}: the target's hidden_size "
                                         rf"is {target.hidden_size}"):
        _engine(target, stand_in(head, HEAD_MEMBERS, cfg=wide))


def test_a_head_over_another_vocabulary_is_refused_naming_both():
    target, head = models("eagle")
    v = target.cfg.vocab_size
    with pytest.raises(ValueError, match=rf"vocab_size={v - 1}: the target's vocabulary is {v}"):
        _engine(target, stand_in(head, HEAD_MEMBERS, vocab_size=v - 1))
