"""`PhaseKey`: a phase graph's name as a typed value, written and read in one module (issue 50)."""

from __future__ import annotations

import pytest

from draftgraph.runtime.worker.phase_key import PhaseKey


def test_a_key_names_its_phase_and_tier_and_is_read_back():
    key = PhaseKey("verify", 512)
    assert key.name == "verify@512"
    assert PhaseKey.parse("extend@128") == PhaseKey("extend", 128)
    assert PhaseKey.parse(key.name) == key and {key: 1}[PhaseKey("verify", 512)] == 1  # frozen: a dict key


@pytest.mark.parametrize("name", ["verify", "verify@", "@512", "verify@x", "verify@-1", "verify@0"])
def test_a_name_that_is_not_kind_at_tier_is_refused_naming_it(name):
    with pytest.raises(ValueError, match="kind|tier|phase name"):
        PhaseKey.parse(name)


@pytest.mark.parametrize("kind,tier", [("", 8), ("a@b", 8), ("verify", 0), ("verify", True), ("verify", "8")])
def test_bad_fields_are_refused(kind, tier):
    with pytest.raises(ValueError):
        PhaseKey(kind, tier)
