"""Sampling follows the target's distribution: G-tests over 20,000 keyed draws at fixed seeds (so
the tests are deterministic), expected counts computed here from the target's logits alone.

The verify rule is checked on a chain of one draft over the tiny default target: the draft is
the target's argmax at the root (a deterministic draft, as the engine's); the first emitted token
must follow p(root) and, when it is the draft, the second must follow p(child). A planted bug
(accepting the draft without drawing) fails the first test by a wide margin (docs/sampling.md).
"""

from __future__ import annotations

import functools

import pytest
import torch
from engine_support import models, prompts

from draftgraph.runtime import SamplingParams, VerifyTree
from draftgraph.runtime.engine.accept_policy import SAMPLED_ACCEPT
from draftgraph.runtime.models.greedy import prefill
from draftgraph.runtime.sampling import SamplingRows, choose_tokens

DRAWS = 20_000
ALPHA = 1e-3  # at fixed seeds the p-values below are fixed numbers; a right sampler sits far above


def g_test(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """(G, p-value) of ``counts`` [V] against ``probs`` [V] (categories expecting < 5 pooled;
    a count in a category of probability 0 gives p = 0)."""
    counts, probs = counts.double(), probs.double()
    if bool((counts[probs == 0] > 0).any()):
        return float("inf"), 0.0
    expected = probs * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    g = 2 * float((obs[obs > 0] * (obs[obs > 0] / exp[obs > 0]).log()).sum())
    df = len(obs) - 1
    return g, float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(g / 2, dtype=torch.float64)))


@functools.lru_cache(maxsize=1)
def _two_nodes() -> tuple[torch.Tensor, int, int]:
    """(logits [2, V] float64 at the root and at its argmax child, the child's token, the prompt length)."""
    target, _ = models("eagle")
    prompt = list(prompts()[3])
    logits, _ = prefill(target, target.new_cache(2), 1, prompt)
    child = int(logits[-1].argmax())
    logits2, _ = prefill(target, target.new_cache(2), 1, prompt + [child])
    return torch.stack([logits[-1], logits2[-1]]).double(), child, len(prompt)


def _reference(logits: torch.Tensor, temperature: float, top_k: int = 0) -> torch.Tensor:
    """The filtered distribution written out directly: softmax(logits / T) over the top k."""
    p = torch.softmax(logits / temperature, -1)
    if top_k:
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[p.topk(top_k).indices] = True
        p = torch.where(keep, p, 0.0)
    return p / p.sum()


def _walk(params: SamplingParams, seed0: int) -> torch.Tensor:
    """The emitted tokens [DRAWS, 2] of the chain root -> argmax child (-1: not emitted)."""
    logits, child, plen = _two_nodes()
    b = DRAWS
    rows = SamplingRows.of([params.with_seed(seed0 + i) for i in range(b)], "cpu")
    positions = torch.tensor([[plen - 1, plen]]).expand(b, 2)  # node positions (tokens drawn at +1)
    chosen = SAMPLED_ACCEPT.choose(logits[None].expand(b, 2, -1), positions, rows)
    parents = torch.tensor([[-1, 0]]).expand(b, 2)
    toks = torch.tensor([[0, child]]).expand(b, 2)
    tree = VerifyTree(toks.reshape(-1), positions.reshape(-1), parents, torch.ones(b, 2, 2, dtype=torch.bool),
                      parents, parents, parents)
    acc = SAMPLED_ACCEPT.accept(tree, chosen, 1)
    out = torch.full((b, 2), -1)
    for i, row in enumerate(acc.committed):
        out[i, :len(row)] = torch.tensor(row)
    return out


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 20)])
def test_speculative_tokens_follow_the_target(temperature, top_k):
    logits, child, _ = _two_nodes()
    out = _walk(SamplingParams(temperature, top_k=top_k), seed0=1000)
    p_root = _reference(logits[0], temperature, top_k)
    v = logits.shape[1]
    first = torch.bincount(out[:, 0], minlength=v)
    g, p_value = g_test(first, p_root)
    assert p_value > ALPHA, (g, p_value)
    # the draft is accepted exactly when the root's sample is the draft: the second token
    # then follows the child's distribution, and is emitted nowhere else
    took = out[:, 0] == child
    assert bool((out[~took, 1] == -1).all()) and bool((out[took, 1] >= 0).all())
    g2, p2 = g_test(torch.bincount(out[took, 1], minlength=v), _reference(logits[1], temperature, top_k))
    assert p2 > ALPHA, (g2, p2)
    assert 0.1 < float(took.double().mean()) < 0.95  # the test exercises both branches


def test_the_g_test_sees_a_wrong_distribution():
    """The statistic has power here: the root's draws tested against a distribution a planted bug
    would give, the root's own with its most likely token's mass halved (whatever the trained
    weights: another machine's toy may give the root and its child alike distributions)."""
    logits, _, _ = _two_nodes()
    out = _walk(SamplingParams(1.0), seed0=1000)
    wrong = _reference(logits[0], 1.0).clone()
    wrong[int(wrong.argmax())] /= 2
    _, p_value = g_test(torch.bincount(out[:, 0], minlength=logits.shape[1]), wrong / wrong.sum())
    assert p_value < 1e-6


@pytest.mark.parametrize("params", [SamplingParams(1.0, top_p=0.9), SamplingParams(1.0, min_p=0.05),
                                    SamplingParams(0.5, top_k=5, top_p=0.8)], ids=str)
def test_filters_keep_the_allowed_set_and_its_proportions(params):
    """top-p / min-p / top-k with top-p: every draw in the allowed set (computed here from the sorted
    probabilities) and the draws proportional to the renormalized probabilities."""
    logits, _, plen = _two_nodes()
    x = logits[0] / params.temperature
    p = torch.softmax(x, -1)
    order = p.argsort(descending=True, stable=True)
    allowed = torch.zeros_like(p, dtype=torch.bool)
    kept = order[:params.top_k] if params.top_k else order
    mass_k = p[kept].sum()
    mass = 0.0
    for t in kept.tolist():  # smallest set holding top_p of the top-k mass
        if mass >= params.top_p * mass_k:
            break
        allowed[t] = True
        mass += float(p[t])
    allowed &= p >= params.min_p * p.max()
    b = DRAWS
    rows = SamplingRows.of([params.with_seed(50_000 + i) for i in range(b)], "cpu")
    toks = choose_tokens(logits[:1][None].expand(b, 1, -1), torch.full((b, 1), plen), rows)[:, 0]
    assert bool(allowed[toks].all())
    q = torch.where(allowed, p, 0.0)
    _, p_value = g_test(torch.bincount(toks, minlength=p.shape[0]), q / q.sum())
    assert p_value > ALPHA
