"""Log-probabilities of the response tokens of a `TokenBatch` under a causal LM.

Alignment (verl's layout): the prompt is left-padded to L_p and the response right-padded to
L_r, so the hidden states at positions [L-L_r-1, L-1) = [-L_r-1:-1] predict the response ids.

Memory: the full-vocabulary fp32 logits of every response position are never materialised. The
model runs up to its final hidden states (a pre-hook on the output embedding captures them and
lets the head project a single position), then `chunked_scores` projects `chunk_size` positions
at a time, takes the log-softmax of the target (logsumexp per chunk) and optionally the entropy,
and keeps only those two numbers per position. Under autograd each chunk is activation-
checkpointed, so the backward pass recomputes one chunk's logits at a time instead of holding
all of them. Only valid (unpadded) response positions are projected.

Constrained rows: where the sampler was restricted to `allowed_ids`, the log-prob is
renormalised over the allowed ids (z[y] - logsumexp(z[allowed])), which is exactly the
distribution the engine sampled from; elsewhere it is the full-vocabulary log-softmax.
Logits are divided by the rollout temperature and computed in float32.

`response_logits` (the whole (B, L_r, V) tensor) is kept as the reference implementation for
tests and small diagnostics; the training path never calls it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from learner.algos import entropy_from_logits
from learner.types import TokenBatch

DEFAULT_CHUNK = 1024
"""Positions projected to the vocabulary at once (1024 x 151,936 fp32 logits = 0.6 GB)."""


@dataclass(frozen=True)
class ResponseScores:
    logp: torch.Tensor  # (B, L_r) float32: log pi(response_t | prompt, response_<t); 0 on padding
    entropy: torch.Tensor | None  # (B, L_r) float32: entropy of the (constrained) distribution


def response_logits(model: torch.nn.Module, batch: TokenBatch, *, temperature: float) -> torch.Tensor:
    """(B, L_r, V) float32 logits / temperature; row t predicts batch.responses[:, t]. Reference
    implementation (materialises every logit): tests and diagnostics only."""
    device = next(model.parameters()).device
    out = model(
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device),
        logits_to_keep=batch.response_length + 1,
        use_cache=False,
    )
    return out.logits[:, :-1].float() / temperature


def _allowed_logits(logits: torch.Tensor, allowed_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., K) logits of the allowed ids (-inf on empty slots) and the (...) constrained flag.
    Unconstrained positions keep finite filler values so no NaN reaches the backward pass."""
    empty = allowed_ids < 0
    constrained = ~empty.all(-1)
    gathered = logits.gather(-1, allowed_ids.clamp_min(0))
    return gathered.masked_fill(empty & constrained[..., None], float("-inf")), constrained


def logprobs_from_logits(
    logits: torch.Tensor, responses: torch.Tensor, allowed_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """log p(responses) from (..., V) logits; renormalised over `allowed_ids` (..., K) where
    a position is constrained. -> (...)."""
    chosen = logits.gather(-1, responses[..., None]).squeeze(-1)
    lse = logits.logsumexp(-1)
    if allowed_ids is not None:
        allowed_logits, constrained = _allowed_logits(logits, allowed_ids)
        lse = torch.where(constrained, allowed_logits.logsumexp(-1), lse)
    return chosen - lse


def entropy_of_logits(logits: torch.Tensor, allowed_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy of the (constrained where `allowed_ids` says so) sampling distribution: (...)."""
    entropy = entropy_from_logits(logits)
    if allowed_ids is not None:
        allowed_logits, constrained = _allowed_logits(logits, allowed_ids)
        entropy = torch.where(constrained, entropy_from_logits(allowed_logits), entropy)
    return entropy


def _chunk_scores(
    project: Callable[[torch.Tensor], torch.Tensor],
    temperature: float,
    with_entropy: bool,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    allowed: torch.Tensor | None,
) -> torch.Tensor:
    """(n,) log-probs, or (2, n) log-probs and entropies, of one chunk of positions."""
    logits = project(hidden).float() / temperature
    logp = logprobs_from_logits(logits, targets, allowed)
    if not with_entropy:
        return logp
    return torch.stack([logp, entropy_of_logits(logits, allowed)])


def chunked_scores(
    hidden: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    *,
    allowed_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`chunked_logprobs` with any projection `project(hidden[n, H]) -> logits[n, V]` (the model's
    own output-embedding module, so ZeRO-3 gathers its weight) and optional `allowed_ids` [N, K]
    (-1 = empty slot; a row with no allowed id is unconstrained)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    fn = functools.partial(_chunk_scores, project, temperature, with_entropy)
    grad = torch.is_grad_enabled()
    parts = []
    for start in range(0, hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        allowed = None if allowed_ids is None else allowed_ids[rows]
        args = (hidden[rows], targets[rows], allowed)
        parts.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    out = torch.cat(parts, dim=-1)
    return (out[0], out[1]) if with_entropy else (out, None)


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) and (optionally) the entropy of softmax(hidden @ weight.T / temperature),
    computed `chunk_size` positions at a time so the [N, V] fp32 logits never exist at once.

    hidden [N, H]: final hidden states of the positions that predict `targets` (any dtype; cast
    to weight's dtype for the projection, as the model's head would compute it); weight [V, H]:
    the lm_head weight; targets [N] int64. Returns (log-probs [N] float32, entropy [N] float32 or
    None). Differentiable w.r.t. hidden and weight; under autograd each chunk is checkpointed
    (its logits are recomputed in backward), so peak memory is about one chunk's logits."""

    def project(h: torch.Tensor) -> torch.Tensor:
        return F.linear(h.to(weight.dtype), weight)

    return chunked_scores(
        hidden, project, targets, temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy
    )


def _output_head(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    head = inner.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(inner).__name__} has no output embedding (lm_head); a causal LM is needed")
    return head


@contextlib.contextmanager
def _captured_head_input(head: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """While active, the head's first call records its input hidden states and projects only the
    last position (so the model's own forward never builds the big logits tensor)."""
    seen: dict[str, torch.Tensor] = {}

    def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        if "hidden" in seen:
            return None
        seen["hidden"] = args[0]
        return (args[0][..., -1:, :], *args[1:])

    handle = head.register_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def response_hidden(model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, torch.nn.Module]:
    """(B, L_r, H) final hidden states whose projection predicts batch.responses, and the head."""
    device = next(model.parameters()).device
    head = _output_head(model)
    with _captured_head_input(head) as seen:
        model(
            input_ids=batch.input_ids.to(device),
            attention_mask=batch.attention_mask.to(device),
            position_ids=batch.position_ids.to(device),
            logits_to_keep=batch.response_length + 1,
            use_cache=False,
        )
    if "hidden" not in seen:
        raise RuntimeError("the model's forward never called its output embedding; cannot score responses")
    return seen["hidden"][:, :-1], head


def _head_call_scores(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    allowed: torch.Tensor | None,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`chunked_scores` of all positions inside ONE call of the head module (its forward is swapped
    for the chunk loop for the duration): ZeRO-3 gathers the head's weight once per call, on every
    rank alike, however many chunks a rank's positions need (a per-chunk module call would make
    ranks with different position counts issue different numbers of gathers, and hang), and its
    backward hooks re-gather the weight before the chunks are recomputed."""

    def forward(h: torch.Tensor, t: torch.Tensor, a: torch.Tensor | None) -> torch.Tensor:
        def project(x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, head.weight, getattr(head, "bias", None))

        logp, ent = chunked_scores(
            h, project, t, allowed_ids=a, temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy
        )
        return logp[None] if ent is None else torch.stack([logp, ent])

    previous = head.__dict__.get("forward")
    head.forward = forward
    try:
        out = head(hidden, targets, allowed)
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous
    return (out[0], out[1]) if with_entropy else (out[0], None)


def response_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK,
) -> ResponseScores:
    """Score `batch.responses` under `model` (gradients flow unless called under no_grad).
    Only the valid response positions are projected, `chunk_size` at a time."""
    hidden, head = response_hidden(model, batch)
    return _scores_from_hidden(hidden, head, batch, temperature, with_entropy, chunk_size)


def _scores_from_hidden(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    batch: TokenBatch,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
) -> ResponseScores:
    device = hidden.device
    shape = batch.responses.shape
    valid = torch.nonzero(batch.response_mask.reshape(-1) > 0).squeeze(-1).to(device)
    allowed = None
    if batch.allowed_ids is not None:
        allowed = batch.allowed_ids.reshape(-1, batch.allowed_ids.shape[-1]).to(device)[valid]
    logp, entropy = _head_call_scores(
        head, hidden.reshape(-1, hidden.shape[-1])[valid], batch.responses.reshape(-1).to(device)[valid],
        allowed, temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
    )  # fmt: skip

    def scatter(values: torch.Tensor) -> torch.Tensor:
        flat = torch.zeros(shape.numel(), dtype=torch.float32, device=device)
        return flat.index_copy(0, valid, values).reshape(shape)

    return ResponseScores(logp=scatter(logp), entropy=None if entropy is None else scatter(entropy))


def response_logprobs_and_op_logits(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float,
    positions: torch.Tensor,
    op_token_ids: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward: the response log-probs (B, L_r) and, per row, the temperature-scaled logits
    of `op_token_ids` (B, K) at response position `positions` (B,) (the logits that PREDICT
    response token `positions[i]`, i.e. the decision position; -1 = none, gives zeros).
    Gradients flow unless called under no_grad (UniSkill's proposer forward)."""
    hidden, head = response_hidden(model, batch)
    scores = _scores_from_hidden(hidden, head, batch, temperature, False, chunk_size)
    device = hidden.device
    pos = positions.to(device)
    rows = torch.arange(hidden.shape[0], device=device)
    at = head(hidden[rows, pos.clamp(0, hidden.shape[1] - 1)]).float() / temperature  # (B, V)
    op_logits = at.gather(-1, op_token_ids.to(device)) * (pos >= 0)[:, None].to(at.dtype)
    return scores.logp, op_logits
