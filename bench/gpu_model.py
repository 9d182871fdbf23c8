"""Random-init Qwen2/Qwen3-shaped causal LMs for bench/gpu_check.py, built by transformers from a
config written in code (no hub, no download): the shapes below are the published configs' sizes.

`hf_model(shape)` builds the model in memory; `write_model_dir(shape, out)` saves one as an HF
directory (config, bf16 safetensors, generation config and a word-level tokenizer with one token
per id, so every sampled id decodes) that the project's `LearnerWorker` and `HFEngine` load as
they load a real checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

EOS_ID = 0
"""The random model's end-of-sequence id (also its padding id); workloads draw ids from 1 up."""


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


def _config(s: Shape):
    import transformers

    common = {"vocab_size": s.vocab, "hidden_size": s.hidden, "num_hidden_layers": s.layers,
              "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "intermediate_size": s.intermediate,
              "tie_word_embeddings": s.tied, "rope_theta": s.rope_theta, "max_position_embeddings": 32_768,
              "eos_token_id": EOS_ID, "pad_token_id": EOS_ID}
    if s.qk_norm:
        return transformers.Qwen3Config(head_dim=s.head_dim, **common), transformers.Qwen3ForCausalLM
    return transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM


def hf_model(s: Shape, *, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A random-init transformers causal LM of shape `s`, built directly on `device` in `dtype` (no
    full-size copy on the host), with SDPA attention."""
    cfg, cls = _config(s)
    cfg._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return cls(cfg)
    finally:
        torch.set_default_dtype(previous)


def _tokenizer(vocab: int):
    """A word-level tokenizer with one token "<i>" per id (the random model has no text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token=f"<{EOS_ID}>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"<{EOS_ID}>", pad_token=f"<{EOS_ID}>")


def write_model_dir(s: Shape, out: Path, *, device: torch.device) -> Path:
    """Save a random-init model of shape `s` (bf16 weights) with its tokenizer as an HF directory."""
    from transformers import GenerationConfig

    model = hf_model(s, device=device, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    _tokenizer(s.vocab).save_pretrained(out)
    return out
