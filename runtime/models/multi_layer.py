"""Multi-layer (MTP-style) draft: S small layers, one token each, chained.

Layer l takes (the previous layer's feature, the embedding of the previous layer's token) and
predicts the next token; layer 0's inputs are the target's last hidden state and the bonus
token. No attention and no cache: the draft is a pure function of the last committed position,
so the engine runs it eagerly and `MultiLayerEagleDraftWorker` organizes its [b, S] tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .layers import RMSNorm, SwiGLU, TargetHeadCopy

__all__ = ["MultiLayerConfig", "MultiLayerDraft"]


@dataclass(frozen=True)
class MultiLayerConfig:
    """Shape of the multi-layer draft (dim is the target's)."""

    dim: int = 192
    n_layers: int = 5
    ffn: int = 384

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Layer(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.norm_feat, self.norm_emb = RMSNorm(d), RMSNorm(d)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, ffn)

    def forward(self, feat: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = self.fc(torch.cat([self.norm_feat(feat), self.norm_emb(emb)], -1))
        return x + self.mlp(self.mlp_norm(x))


class MultiLayerDraft(TargetHeadCopy):
    """``n_layers`` chained layers (float32) with frozen copies of the target's embedding, norm and head."""

    def __init__(self, target: nn.Module, cfg: MultiLayerConfig | None = None, seed: int = 0) -> None:
        super().__init__()
        cfg = cfg or MultiLayerConfig(dim=target.cfg.dim)
        torch.manual_seed(seed + 2)
        self.cfg = cfg
        self.layers = nn.ModuleList(_Layer(cfg.dim, cfg.ffn) for _ in range(cfg.n_layers))
        self.share_target(target)

    @property
    def max_steps(self) -> int:
        """The most draft tokens (S) it can produce."""
        return self.cfg.n_layers

    def forward(self, feat: torch.Tensor, token: torch.Tensor, num_steps: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """feat [b, d] (the target's hidden at the last committed position), token [b] (the bonus)
        -> (topk_p, topk_index) [b, num_steps]: each layer's top-1 probability and token."""
        if not 1 <= num_steps <= self.max_steps:
            raise ValueError(f"num_steps={num_steps}: this multi-layer draft has {self.max_steps} layers")
        feat = feat.float()
        probs, ids = [], []
        for layer in self.layers[:num_steps]:
            feat = layer(feat, self.embed_w[token])
            p, token = torch.softmax(self.logits(feat), -1).max(-1)
            probs.append(p)
            ids.append(token)
        return torch.stack(probs, 1), torch.stack(ids, 1)

    def train_forward(self, feats: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Teacher-forced chains from every position: feats [B, T, d], tokens [B, T] (tokens[:, t]
        follows feats[:, t]). Layer l at row t consumes tokens[:, t + l]; returns logits
        [B, T - l, V] per layer (row t of layer l predicts the token after tokens[:, t + l])."""
        out = []
        feat = feats
        for i, layer in enumerate(self.layers):
            t = tokens.shape[1] - i
            feat = layer(feat[:, :t], self.embed_w[tokens[:, i:]])
            out.append(self.logits(feat))
        return out
