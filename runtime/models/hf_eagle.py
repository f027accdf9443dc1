"""`HFEagleHead`: what the published EAGLE heads share, in the engine's draft-head shape
(`engine.model_seam.DraftHead`); the two formats are two classes (`eagle_heads`):

- EAGLE-1/2 (`Eagle1Head`): ``fc`` [H, 2H] over cat(embed(token), feature), Llama decoder
  ``layers.{i}`` (layer 0 without ``input_layernorm``), no final norm; the embedding and the LM
  head are the target's (shared, not copied). The target's feature is its final normed state.
- EAGLE-3 (`Eagle3Head`): ``fc`` [H, 3H] over three of the target's residual streams (used
  where the row's feature is the target's, in `extend`); ``midlayer`` whose q/k/v take 2H,
  cat(input_layernorm(embed), hidden_norm(feature)); ``norm``; ``lm_head`` [draft_vocab, H] and
  ``d2t`` (target id = draft id + d2t[id]), applied inside the step: the logits come out over
  the target's vocabulary (-inf outside the draft vocabulary). The embedding is the target's.

Parameter names are the published key layout (SafeAILab EAGLE, vLLM, SGLang), so a checkpoint
loads with ``load_state_dict``. The engine-facing calls (``forward(input_ids, rows)``
capturable, ``initial_state``, ``extend``, ``allocate_cache``, ``row_template``) take the same
`DraftRows`, with ``ancestors`` [M, A, layers, 2, kv_heads, head_dim] (every layer's K/V of the
tokens drafted before the row in this step). The head computes in the target's dtype; logits
leave as float32. A deep copy (the engine serves a copy of its draft) shares the target's
tensors. transformers (its Llama norm, MLP and RoPE) is imported when a head is built, not with
this module.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from .kv_cache import KVCache
from .layers import cached_attention

__all__ = ["FORMATS", "DecoderLayer", "DraftRows", "HFEagleConfig", "HFEagleHead"]

FORMATS = ("eagle1", "eagle3")


class DraftRows(NamedTuple):
    """A head's per-row draft state (M rows): what one draft token needs, as named tensors, so
    that the worker's row re-selection (tree parents) carries all of it (`runtime.topology.draft_rows`).
    ``position`` is where the row's token sits, ``base`` the request's committed length (the
    draft cache holds positions < base), ``ancestors`` the K/V of the tokens drafted before it in
    this step (exact tree attention). Pad rows (all zeros) read the dummy slot 0."""

    feature: torch.Tensor  # [M, dim], the head's dtype
    slot: torch.Tensor  # [M] int64, the request's cache slot
    position: torch.Tensor  # [M] int64, this row's token position
    base: torch.Tensor  # [M] int64, the request's committed length
    ancestors: torch.Tensor  # [M, max_ancestors, layers, 2, kv_heads, head_dim]


@dataclasses.dataclass(frozen=True)
class HFEagleConfig:
    """Shape of a published head as the engine sees it (``dim`` is the carried feature's width)."""

    fmt: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    feature_width: int
    feature_layers: tuple[int, ...]
    max_len: int
    max_ancestors: int
    config_json: str


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' Llama RoPE pairing: (x1, x2) -> (-x2, x1) over the two halves."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class _Attention(nn.Module):
    """q/k/v/o projections of a Llama attention over ``in_dim`` inputs."""

    def __init__(self, in_dim: int, dim: int, heads: int, kv_heads: int, head_dim: int,
                 biased: frozenset[str]) -> None:
        super().__init__()
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias="q_proj" in biased)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias="k_proj" in biased)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias="v_proj" in biased)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias="o_proj" in biased)


class DecoderLayer(nn.Module):
    """A Llama decoder layer's modules (attention input built by the head)."""

    def __init__(self, config: Any, in_dim: int, input_norm: bool, hidden_norm: bool, head_dim: int,
                 biased: frozenset[str]) -> None:
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        if input_norm:
            self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        if hidden_norm:
            self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = _Attention(in_dim, h, config.num_attention_heads, config.num_key_value_heads, head_dim,
                                    biased)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(config)


class HFEagleHead(nn.Module):
    """What the published heads share (`Eagle1Head`, `Eagle3Head` in `eagle_heads`; build one by
    format with `eagle_heads.make_head`): the Llama attention over the draft cache and the rows'
    ancestors, the capturable draft call, `extend`, the training passes. A subclass says what
    differs: its modules (`_build`), how a row's first input is made (`_inputs`), its decoder
    blocks (`_blocks`) and its logits (`_logits`, over the target's vocabulary). ``target`` is an
    `HFTarget` whose features the head reads; ``max_len`` is the target's cache length.
    ``biased``: the linear layers with a bias ("fc", "q_proj", "k_proj", "v_proj", "o_proj";
    None: the subclass's `default_biased` of the config). Weights are loaded by the caller
    (`hf_models.load_draft`)."""

    fmt: ClassVar[str]  # the published layout's name (`FORMATS`): what `describe` reports

    def __init__(self, config: Any, target: Any, n_layers: int, draft_vocab_size: int, max_ancestors: int = 7,
                 biased: frozenset[str] | None = None, dtype: torch.dtype | None = None) -> None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        super().__init__()
        h = config.hidden_size
        heads, kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        hd = getattr(config, "head_dim", None) or h // heads
        self.cfg = HFEagleConfig(self.fmt, h, n_layers, heads, kv, hd, target.vocab_size, draft_vocab_size,
                                 target.hidden_size, tuple(target.cfg.feature_layers), target.cfg.max_len,
                                 max_ancestors, config.to_json_string(use_diff=False))
        self._build(config, self.default_biased(config) if biased is None else biased)
        self.rotary = LlamaRotaryEmbedding(config)
        dtype, device = dtype or target.dtype, target.device
        self.to(dtype=dtype, device=device)
        # RoPE angles once, as tables read by position: every backend then gathers the same
        # values (a compiled kernel's own cos / sin may differ from eager's in the last bit)
        with torch.no_grad():
            cos, sin = self.rotary(torch.zeros(1, dtype=dtype, device=device),
                                   torch.arange(target.cfg.max_len, device=device)[None])
        self.register_buffer("rope_cos", cos[0], persistent=False)  # [max_len, head_dim]
        self.register_buffer("rope_sin", sin[0], persistent=False)
        # the target's tensors, shared (non-persistent: never saved, refitted or copied); in a
        # head of another dtype than the target's (a q4 target's float32 head), a converted copy
        self.register_buffer("embed_w", target.embed.weight.detach().to(dtype), persistent=False)
        self._share_target(target)
        self.cache: KVCache | None = None

    # ---- what a format says -------------------------------------------------------------------
    @staticmethod
    def default_biased(config: Any) -> frozenset[str]:
        """The linear layers with a bias when the caller names none (the config's attention_bias)."""
        return frozenset({"q_proj", "k_proj", "v_proj", "o_proj"} if getattr(config, "attention_bias", False) else ())

    def _build(self, config: Any, biased: frozenset[str]) -> None:
        """Register the format's own modules (its published parameter names)."""
        raise NotImplementedError

    def _share_target(self, target: Any) -> None:
        """Register the target's tensors the format reads besides its embedding (none here)."""

    def _shared(self) -> tuple[torch.Tensor, ...]:
        """The target's tensors a copy shares instead of copying."""
        return (self.embed_w,)

    def _blocks(self) -> list[DecoderLayer]:
        raise NotImplementedError

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (float32)."""
        raise NotImplementedError

    def _inputs(self, feature: torch.Tensor, tokens: torch.Tensor, from_target: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the first layer's attention input, its residual) for features and next tokens."""
        raise NotImplementedError

    def __deepcopy__(self, memo: dict[int, Any]) -> HFEagleHead:
        """A copy sharing the target's tensors (the engine copies its draft to own the cache)."""
        for t in self._shared():
            memo[id(t)] = t
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    # ---- sizes --------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.embed_w.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_w.device

    @property
    def vocab_size(self) -> int:
        """The vocabulary the logits come over: the target's."""
        return self.cfg.vocab_size

    def row_template(self, rows: int, device: torch.device | str) -> DraftRows:
        """Zero draft rows [rows, ...] (the worker's static graph inputs and its input rules)."""
        c = self.cfg
        long = torch.int64
        return DraftRows(torch.zeros(rows, c.dim, dtype=self.dtype, device=device),
                         torch.zeros(rows, dtype=long, device=device), torch.zeros(rows, dtype=long, device=device),
                         torch.zeros(rows, dtype=long, device=device),
                         torch.zeros(rows, c.max_ancestors, c.n_layers, 2, c.n_kv_heads, c.head_dim,
                                     dtype=self.dtype, device=device))

    def allocate_cache(self, slots: int) -> KVCache:
        """Allocate the draft cache once; graphs captured later read these very tensors."""
        c = self.cfg
        self.cache = KVCache.zeros(c.n_layers, slots, c.max_len, c.n_kv_heads, c.head_dim, self.dtype,
                                   self.embed_w.device)
        return self.cache

    # ---- shared pieces ------------------------------------------------------------------------
    def _qkv(self, layer: DecoderLayer, x: torch.Tensor, pos: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [..., H, hd], k, v [..., Hk, hd] with RoPE at pos [...]."""
        c, attn = self.cfg, layer.self_attn
        q = attn.q_proj(x).unflatten(-1, (c.n_heads, c.head_dim))
        k = attn.k_proj(x).unflatten(-1, (c.n_kv_heads, c.head_dim))
        v = attn.v_proj(x).unflatten(-1, (c.n_kv_heads, c.head_dim))
        cos, sin = self.rope_cos[pos].unsqueeze(-2), self.rope_sin[pos].unsqueeze(-2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    @staticmethod
    def _finish(layer: DecoderLayer, residual: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        x = residual + layer.self_attn.o_proj(att)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _next_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self._blocks()[i].input_layernorm(x)

    # ---- the capturable draft call ------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, rows: DraftRows) -> tuple[torch.Tensor, DraftRows]:
        """One draft token per row: input_ids [M], rows (M rows) -> (logits [M, V] float32, the
        next rows: the new feature, position + 1, this token's K/V among the ancestors)."""
        c = self.cfg
        a, g = c.max_ancestors, c.n_heads // c.n_kv_heads
        slot, base, anc = rows.slot, rows.base, rows.ancestors
        pos = rows.position.clamp(0, c.max_len - 1)
        lk = self.cache.k[0].shape[1]
        pre_ok = torch.arange(lk, device=pos.device)[None] < base[:, None]  # [M, L]
        anc_ok = torch.arange(a, device=pos.device)[None] < (pos - base)[:, None]  # [M, A]
        x, residual = self._inputs(rows.feature, input_ids, from_target=False)
        scale = c.head_dim ** -0.5
        new_kv = []
        out = residual
        for i, layer in enumerate(self._blocks()):
            if i:
                residual = out
                x = self._next_input(i, out)
            q, k, v = self._qkv(layer, x, pos)  # q [M, H, hd], k, v [M, Hk, hd]
            q = q.unflatten(1, (c.n_kv_heads, g))  # [M, Hk, g, hd]
            keys, vals = self.cache.k[i][slot], self.cache.v[i][slot]  # [M, L, Hk, hd]
            ak, av = anc[:, :, i, 0], anc[:, :, i, 1]  # [M, A, Hk, hd]
            s = torch.cat([
                (torch.einsum("mkgd,mlkd->mkgl", q, keys) * scale).masked_fill(~pre_ok[:, None, None], float("-inf")),
                (torch.einsum("mkgd,makd->mkga", q, ak) * scale).masked_fill(~anc_ok[:, None, None], float("-inf")),
                torch.einsum("mkgd,mkd->mkg", q, k)[..., None] * scale], -1)
            p = torch.softmax(s, -1)
            att = (torch.einsum("mkgl,mlkd->mkgd", p[..., :lk], vals)
                   + torch.einsum("mkga,makd->mkgd", p[..., lk:lk + a], av)
                   + p[..., lk + a:] * v[:, :, None])
            out = self._finish(layer, residual, att.flatten(1))
            new_kv.append(torch.stack([k, v], 1))  # [M, 2, Hk, hd]
        j = (pos - base).clamp(0, a - 1)
        onehot = (torch.arange(a, device=j.device)[None] == j[:, None]).to(anc.dtype)  # no host read of j
        onehot = onehot[:, :, None, None, None, None]
        new = torch.stack(new_kv, 1)[:, None]  # [M, 1, layers, 2, Hk, hd]
        anc = anc + onehot * (new - anc)
        return self._logits(out), DraftRows(out, slot, rows.position + 1, base, anc)

    def initial_state(self, feat: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor) -> DraftRows:
        """Draft rows for the first draft token of each request: feat [b, dim] (the carried
        feature), slots [b], seq_lens [b]; no ancestors yet."""
        c = self.cfg
        b = feat.shape[0]
        lens = seq_lens.to(torch.int64)
        anc = torch.zeros(b, c.max_ancestors, c.n_layers, 2, c.n_kv_heads, c.head_dim, dtype=self.dtype,
                          device=feat.device)
        return DraftRows(feat.to(self.dtype), slots.to(torch.int64), lens, lens, anc)

    # ---- extend (writes the cache) ------------------------------------------------------------
    def extend(self, feats: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor, write_slot: torch.Tensor, mask: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head over committed positions: feats [B, T, F] (the target's features at each
        position), next_tokens [B, T] (the token after each), positions [B, T]; writes every
        layer's K/V at (write_slot, positions) and attends under mask [B, T, Lk]. Returns
        (features [B, T, dim], logits [B, T, V] float32)."""
        x, residual = self._inputs(feats.to(self.dtype), next_tokens, from_target=True)
        out = residual
        for i, layer in enumerate(self._blocks()):
            if i:
                residual = out
                x = self._next_input(i, out)
            q, k, v = self._qkv(layer, x, positions)
            att = cached_attention(q, k, v, self.cache.k[i], self.cache.v[i], slots, positions, write_slot, mask,
                                   scale=self.cfg.head_dim ** -0.5)
            out = self._finish(layer, residual, att)
        return out, self._logits(out)

    # ---- training (first use of the default head) ----------------------------------------------
    def train_forward(self, feats: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two passes over [B, T], as the engine runs the head: pass 0 as `extend` (the target's
        features, causal), pass 1 as the first draft call (row t at position t + 1 fed pass 0's
        output at t and the token after, attending to pass 0's keys at positions <= t and
        itself). Returns (pass-0 logits [B, T, V], pass-1 logits [B, T - 1, V]), float32 over
        the target's vocabulary (EAGLE-3: -inf outside the draft vocabulary)."""
        t = feats.shape[1]
        pos = torch.arange(t, device=feats.device).expand(feats.shape[0], t)
        causal = torch.ones(t, t, dtype=torch.bool, device=feats.device).tril()
        x, residual = self._inputs(feats.to(self.dtype), next_tokens, from_target=True)
        out, keys = self._train_pass(x, residual, pos, [], causal)
        x1, residual1 = self._inputs(out[:, :-1], next_tokens[:, 1:], from_target=False)
        before = torch.ones(t - 1, t, dtype=torch.bool, device=feats.device).tril()  # key s <= row t
        mask1 = torch.cat([before, torch.eye(t - 1, dtype=torch.bool, device=feats.device)], -1)
        out1, _ = self._train_pass(x1, residual1, pos[:, 1:], keys, mask1)
        return self._logits(out), self._logits(out1)

    def unroll(self, feats: torch.Tensor, next_tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """EAGLE-3's training-time test over [B, T]: pass 0 as `extend`, pass k >= 1 as the k-th
        draft call (row t at position t + k, fed pass k - 1's output at t and next_tokens[:, t + k],
        attending to pass 0's keys at positions <= t and to its own row in passes 1..k). Returns
        each pass's output state (before the norm), pass k [B, T - k, dim]."""
        b, t = next_tokens.shape
        pos = torch.arange(t, device=feats.device).expand(b, t)
        causal = torch.ones(t, t, dtype=torch.bool, device=feats.device).tril()
        x, residual = self._inputs(feats.to(self.dtype), next_tokens, from_target=True)
        out, first = self._train_pass(x, residual, pos, [], causal)
        outs, rows = [out], []
        for k in range(1, steps):
            x, residual = self._inputs(outs[-1][:, :t - k], next_tokens[:, k:], from_target=False)
            mine = [[(a[:, :t - k], v[:, :t - k]) for a, v in r] for r in rows]
            out, own = self._row_pass(x, residual, pos[:, k:], first, mine)
            outs.append(out)
            rows.append(own)
        return outs

    def _row_pass(self, x: torch.Tensor, residual: torch.Tensor, pos: torch.Tensor,
                  first: list[tuple[torch.Tensor, torch.Tensor]], rows: list[list[tuple[torch.Tensor, torch.Tensor]]]
                  ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """A draft pass of `unroll` over n rows: each layer attends to ``first``'s K/V [B, >= n, Hk,
        hd] at positions <= the row and to the row's own K/V in every earlier draft pass (``rows``)
        and this one."""
        c = self.cfg
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[:, None, None]
        out, own = residual, []
        for i, layer in enumerate(self._blocks()):
            if i:
                residual = out
                x = self._next_input(i, out)
            q, k, v = self._qkv(layer, x, pos)
            own.append((k, v))
            q = q.unflatten(2, (c.n_kv_heads, c.n_heads // c.n_kv_heads)) * c.head_dim ** -0.5  # [B, n, Hk, g, hd]
            k0, v0 = first[i][0][:, :n], first[i][1][:, :n]
            s0 = torch.einsum("btkgd,bskd->btkgs", q, k0).masked_fill(~causal, float("-inf"))
            ks = torch.stack([r[i][0] for r in rows] + [k], -2)  # [B, n, Hk, m, hd]
            vs = torch.stack([r[i][1] for r in rows] + [v], -2)
            p = torch.softmax(torch.cat([s0, torch.einsum("btkgd,btkmd->btkgm", q, ks)], -1), -1)
            att = (torch.einsum("btkgs,bskd->btkgd", p[..., :n], v0)
                   + torch.einsum("btkgm,btkmd->btkgd", p[..., n:], vs))
            out = self._finish(layer, residual, att.flatten(2))
        return out, own

    def _train_pass(self, x: torch.Tensor, residual: torch.Tensor, pos: torch.Tensor,
                    earlier: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor
                    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Every layer over rows [B, T'] attending under ``mask`` [T', Tk] to ``earlier``'s K/V per
        layer (a pass before this one) followed by this pass's own; returns (output, own K/V)."""
        c = self.cfg
        g = c.n_heads // c.n_kv_heads
        out, own = residual, []
        for i, layer in enumerate(self._blocks()):
            if i:
                residual = out
                x = self._next_input(i, out)
            q, k, v = self._qkv(layer, x, pos)  # [B, T', H, hd], [B, T', Hk, hd]
            own.append((k, v))
            if earlier:
                k = torch.cat([earlier[i][0], k], 1)
                v = torch.cat([earlier[i][1], v], 1)
            k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
            att = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                            v.transpose(1, 2), attn_mask=mask)
            out = self._finish(layer, residual, att.transpose(1, 2).flatten(2))
        return out, own

    def describe(self) -> dict[str, Any]:
        """The head's identity for logs and stats (format, widths, the target layers it reads)."""
        return {k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "config_json"}
