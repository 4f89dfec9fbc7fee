"""A small causal transformer: (N, T) token ids -> (N, T, vocab_size) next-token logits."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t sees positions <= t only.

    Written out rather than ``nn.MultiheadAttention``: calling ``scaled_dot_product_attention`` with
    ``is_causal=True`` and no mask tensor is what lets CUDA pick its fused (flash) kernels.
    """

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, time, width = x.shape
        # (N, T, 3 x width) -> three (N, heads, T, width / heads)
        q, k, v = self.qkv(x).view(batch, time, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, time, width))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads, dropout)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class CausalTransformer(nn.Module):
    """Token and learned position embeddings, ``layers`` pre-norm blocks, a final norm and a linear
    head onto the vocabulary (sharing the token embedding's weights when ``tie_weights``).

    The width is ``heads x head_width``, so every choice of the two is a valid network.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        layers: int = 2,
        heads: int = 4,
        head_width: int = 16,
        dropout: float = 0.0,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        width = heads * head_width
        self.block_size = block_size
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(block_size, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(width, heads, dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.apply(_init_weights)
        if tie_weights:
            self.head.weight = self.token_embedding.weight

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        return self.head(self.norm(self.blocks(x)))


def _init_weights(module: nn.Module) -> None:
    # GPT-2's initialisation: with torch's default N(0, 1) embeddings, a tied head starts with huge logits.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
