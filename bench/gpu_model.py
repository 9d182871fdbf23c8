"""Random-init Qwen2/Qwen3-shaped causal LMs for bench/gpu_check.py, with torch alone.

`build_model(shape)` uses transformers (Qwen3ForCausalLM / Qwen2ForCausalLM from a config written
in code) when it imports, else `TorchDecoder` below: the same architecture in plain torch (RMSNorm,
rotary position embedding, grouped-query attention through F.scaled_dot_product_attention, optional
per-head q/k RMSNorm as in Qwen3, SwiGLU MLP, optionally tied embeddings). Either way the caller
gets `(model, impl)` where `model.hidden(ids) -> [B, T, H]` final hidden states (after the final
norm), `model.head_weight() -> [V, H]` and `model.set_checkpointing(bool)`. No weights are
downloaded: the shapes below are the published configs' sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qk_norm: bool
    rope_theta: float = 1_000_000.0

    def num_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (attn + mlp + 2 * self.hidden) + embed + self.hidden


QWEN3_1P7B = Shape("Qwen3-1.7B", vocab=151_936, hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                   intermediate=6144, tied=True, qk_norm=True)
QWEN25_7B = Shape("Qwen2.5-7B", vocab=152_064, hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                  intermediate=18_944, tied=False, qk_norm=False)
TINY_1P7B = Shape("tiny-qwen3", vocab=1000, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                  intermediate=128, tied=True, qk_norm=True)
TINY_7B = Shape("tiny-qwen2", vocab=1024, hidden=96, layers=2, heads=6, kv_heads=2, head_dim=16,
                intermediate=192, tied=False, qk_norm=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=not s.qk_norm)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=not s.qk_norm)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=not s.qk_norm)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.q_norm = RMSNorm(s.head_dim) if s.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(s.head_dim) if s.qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        s = self.s
        q = self.q_norm(self.q_proj(x).view(b, t, s.heads, s.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, s.kv_heads, s.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, s.heads * s.head_dim))


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden)
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TorchDecoder(nn.Module):
    """A Qwen2/Qwen3-style decoder in plain torch (the fallback when transformers is absent)."""

    def __init__(self, s: Shape):
        super().__init__()
        self.s = s
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden)
        self.lm_head = None if s.tied else nn.Linear(s.hidden, s.vocab, bias=False)
        self.checkpointing = False
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def set_checkpointing(self, on: bool) -> None:
        self.checkpointing = on

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        inv = 1.0 / (self.s.rope_theta ** (torch.arange(0, self.s.head_dim, 2, device=ids.device).float()
                                           / self.s.head_dim))
        freqs = torch.outer(torch.arange(t, device=ids.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.embed_tokens(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        return self.norm(x)


class _HFAdapter(nn.Module):
    """The same three calls over a transformers causal LM."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def set_checkpointing(self, on: bool) -> None:
        if on:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.model.gradient_checkpointing_disable()

    def head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.model(input_ids=ids, use_cache=False).last_hidden_state


def _hf_model(s: Shape) -> nn.Module:
    import transformers

    common = {"vocab_size": s.vocab, "hidden_size": s.hidden, "num_hidden_layers": s.layers,
              "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "intermediate_size": s.intermediate,
              "tie_word_embeddings": s.tied, "rope_theta": s.rope_theta, "max_position_embeddings": 32_768}
    if s.qk_norm:
        cfg = transformers.Qwen3Config(head_dim=s.head_dim, **common)
        cls = transformers.Qwen3ForCausalLM
    else:
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    cfg._attn_implementation = "sdpa"
    return _HFAdapter(cls(cfg))


def build_model(s: Shape, *, device: torch.device, dtype: torch.dtype, prefer_hf: bool = True) -> tuple[nn.Module, str]:
    """A random-init model of shape `s`, built directly on `device` in `dtype` (no full-size copy on
    the host); returns (model, "transformers" | "torch")."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            if prefer_hf:
                try:
                    return _hf_model(s), "transformers"
                except (ImportError, AttributeError):  # no transformers, or one without Qwen3
                    pass
            return TorchDecoder(s), "torch"
    finally:
        torch.set_default_dtype(previous)
