"""The two published EAGLE head formats as two classes over `HFEagleHead`'s shared attention:
`Eagle1Head` (EAGLE-1/2) and `Eagle3Head` (EAGLE-3, with its draft vocabulary and ``d2t``);
`make_head` builds the one a checkpoint's layout names (`hf_models.load_draft`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .hf_eagle import FORMATS, DecoderLayer, HFEagleHead

__all__ = ["Eagle1Head", "Eagle3Head", "make_head"]


class Eagle1Head(HFEagleHead):
    """EAGLE-1/2: ``fc`` [H, 2H] over cat(embed(token), feature), ``layers.{i}`` (layer 0 without
    ``input_layernorm``), the target's LM head (shared). Reads the target's final normed state."""

    fmt = "eagle1"

    def __init__(self, config: Any, target: Any, max_ancestors: int = 7, biased: frozenset[str] | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(config, target, config.num_hidden_layers, target.vocab_size, max_ancestors, biased, dtype)

    @staticmethod
    def default_biased(config: Any) -> frozenset[str]:
        """The attention's bias as `HFEagleHead`'s, and ``fc``'s from the config's ``bias`` (default on)."""
        return HFEagleHead.default_biased(config) | ({"fc"} if getattr(config, "bias", True) else set())

    def _build(self, config: Any, biased: frozenset[str]) -> None:
        h, c = config.hidden_size, self.cfg
        self.fc = nn.Linear(2 * h, h, bias="fc" in biased)
        self.layers = nn.ModuleList(DecoderLayer(config, h, i > 0, False, c.head_dim, biased)
                                    for i in range(c.n_layers))

    def _share_target(self, target: Any) -> None:
        lm = target.model.get_output_embeddings().weight.detach()
        self.register_buffer("lm_w", lm.to(self.dtype), persistent=False)

    def _shared(self) -> tuple[torch.Tensor, ...]:
        return (self.embed_w, self.lm_w)

    def _blocks(self) -> list[DecoderLayer]:
        return list(self.layers)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.lm_w.t()).float()

    def _inputs(self, feature: torch.Tensor, tokens: torch.Tensor, from_target: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(torch.cat([self.embed_w[tokens], feature], -1))
        return x, x


class Eagle3Head(HFEagleHead):
    """EAGLE-3: ``fc`` [H, F] over the target's residual streams (F = their concatenated width),
    one ``midlayer`` over cat(input_layernorm(embed), hidden_norm(feature)), ``norm``, its own
    ``lm_head`` [draft_vocab, H] and the vocabulary map ``d2t`` (target id = draft id + d2t[id]):
    the logits come out over the target's vocabulary, -inf outside the draft vocabulary.
    ``draft_vocab_size`` None: the target's whole vocabulary."""

    fmt = "eagle3"

    def __init__(self, config: Any, target: Any, draft_vocab_size: int | None = None, max_ancestors: int = 7,
                 biased: frozenset[str] | None = None, dtype: torch.dtype | None = None) -> None:
        vd = target.vocab_size if draft_vocab_size is None else draft_vocab_size
        super().__init__(config, target, 1, vd, max_ancestors, biased, dtype)

    def _build(self, config: Any, biased: frozenset[str]) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        h, c = config.hidden_size, self.cfg
        self.fc = nn.Linear(c.feature_width, h, bias="fc" in biased)
        self.midlayer = DecoderLayer(config, 2 * h, True, True, c.head_dim, biased)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))

    def _blocks(self) -> list[DecoderLayer]:
        return [self.midlayer]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        draft = self.lm_head(self.norm(x)).float()
        ids = torch.arange(draft.shape[-1], device=draft.device) + self.d2t
        full = draft.new_full((*draft.shape[:-1], self.cfg.vocab_size), float("-inf"))
        return full.scatter(-1, ids.expand(draft.shape), draft)

    def _inputs(self, feature: torch.Tensor, tokens: torch.Tensor, from_target: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        hid = self.fc(feature) if from_target else feature
        emb = self.embed_w[tokens]
        return torch.cat([self.midlayer.input_layernorm(emb), self.midlayer.hidden_norm(hid)], -1), hid


def make_head(fmt: str, config: Any, target: Any, draft_vocab_size: int | None = None, max_ancestors: int = 7,
              biased: frozenset[str] | None = None, dtype: torch.dtype | None = None) -> HFEagleHead:
    """The head of the published layout ``fmt`` (`FORMATS`, as `hf_models.head_format` tells it
    from a checkpoint); ``draft_vocab_size`` is EAGLE-3's (an EAGLE-1/2 head drafts over the
    target's vocabulary and takes none); ``dtype`` None: the target's."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}: must be one of {list(FORMATS)}")
    if fmt == "eagle1":
        if draft_vocab_size not in (None, target.vocab_size):
            raise ValueError(f"draft_vocab_size={draft_vocab_size}: an EAGLE-1/2 head drafts over the target's "
                             f"vocabulary ({target.vocab_size})")
        return Eagle1Head(config, target, max_ancestors, biased, dtype)
    return Eagle3Head(config, target, draft_vocab_size, max_ancestors, biased, dtype)
