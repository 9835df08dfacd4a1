"""The decoder: embeddings, N × (attention + MLP) with pre-norm residuals, final norm, LM head.

The batch is *flat*: the tokens of all sequences are concatenated into one (num_tokens,) vector
with their positions beside them; the attention backend knows where each sequence starts.
"""

from __future__ import annotations

import torch
from torch import nn

from minillm.attention.backend import AttentionBackend
from minillm.model.attention import SelfAttention
from minillm.model.config import ModelConfig
from minillm.model.layers import GatedMLP, RMSNorm
from minillm.model.linear import Linear, linear
from minillm.model.rope import RotaryEmbedding, Rotation


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def forward(self, x: torch.Tensor, rotation: Rotation, backend: AttentionBackend) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), rotation, backend)
        h, x = self.post_attention_layernorm.add_and_norm(attended, x)  # x = x + attended; h = norm(x)
        return x + self.mlp(h)


class CausalLM(nn.Module):
    """(input_ids, positions, attention backend) -> hidden states; `logits()` applies the LM head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = RotaryEmbedding(config)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: (num_tokens,) -> hidden states (num_tokens, hidden)."""
        x = self.embed_tokens(input_ids)
        rotation = self.rope.at(positions, x.dtype)  # the same for every layer
        for layer in self.layers:
            x = layer(x, rotation, backend)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, hidden) -> (n, vocab) float32 logits; call it only on the rows that need them."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return linear(hidden, weight, None, self).float()
