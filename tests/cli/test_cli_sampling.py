"""The sampling flags of the ``draftgraph`` command: ``generate --temperature 0.8
--seed 3`` prints the same text on every backend and with speculation off, and says it
is the plain sampled run's; ``simulate`` with a temperature is lossless against the plain
sampled baseline; a bad value exits 2 naming the field, before the models load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "draftgraph.runtime"]

pytestmark = pytest.mark.usefixtures("trained_models")  # subprocesses load the cached models


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout)


def test_generate_same_text_on_every_backend_and_without_speculation():
    texts = []
    for extra in (("--backend", "eager"), ("--backend", "trace", "--capture", "blocking"),
                  ("--backend", "eager", "--schedule", "1:0")):
        p = _run("generate", "The cat sat on", "--max-new-tokens", "32", "--temperature", "0.8",
                 "--seed", "3", *extra)
        assert p.returncode == 0, p.stderr
        assert "identical to plain sampling: True" in p.stdout and "seed 3" in p.stdout
        texts.append(p.stdout.split("\n-- sampling")[0])
    assert texts[0] == texts[1] == texts[2]
    greedy = _run("generate", "The cat sat on", "--max-new-tokens", "32", "--backend", "eager")
    assert greedy.stdout.split("\n-- accept")[0] != texts[0]  # it sampled


def test_simulate_samples_losslessly():
    p = _run("simulate", "--requests", "3", "--backend", "eager", "--adaptive", "", "--temperature", "0.7",
             "--top-k", "20", "--sampling-seed", "5", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["lossless"] is True
    assert report["sampling"] == {"temperature": 0.7, "top_p": 1.0, "top_k": 20, "min_p": 0.0, "seed": 5}


@pytest.mark.parametrize("flags,message", [(("--temperature", "0.5", "--top-p", "0"), "top_p=0.0"),
                                           (("--temperature", "-1"), "temperature=-1.0"),
                                           (("--top-k", "5",), "give a temperature > 0")])
def test_bad_sampling_flags_exit_2_naming_the_field(flags, message):
    p = _run("generate", "x", "--backend", "eager", *flags, timeout=60)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert "Loading weights" not in p.stderr  # refused before the models load


def test_simulate_reports_each_temperature_side_by_side():
    """--temperatures: the workload once per temperature (the command's own run serves its own
    temperature), each lossless against its plain baseline (greedy at 0, plain sampling above)."""
    p = _run("simulate", "--requests", "2", "--backend", "eager", "--adaptive", "", "--temperature", "0.7",
             "--top-k", "20", "--sampling-seed", "5", "--temperatures", "0,0.7,1.0", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    rows = report["temperatures"]
    assert [r["temperature"] for r in rows] == [0.0, 0.7, 1.0]
    assert all(r["identical_to_plain"] is True and r["tokens_per_s"] > 0 for r in rows), rows
    assert rows[1]["accept_length_mean"] == report["accept_length_mean"]  # the command's own run


@pytest.mark.parametrize("value,message", [("0,3", "3.0 is not in [0, 2]"), ("0,x", "comma-separated numbers"),
                                           ("1,1", "repeated"), ("0,0.5,0.7,0.9,1", "1 to 4 temperatures")])
def test_bad_temperatures_exit_2_naming_the_flag(value, message):
    p = _run("simulate", "--backend", "eager", "--temperatures", value, timeout=60)
    assert p.returncode == 2 and "--temperatures" in p.stderr and message in p.stderr, p.stderr
    assert "Loading weights" not in p.stderr  # refused before the models load
