"""HF transformers fallback engine: batched sampling with left padding and a KV cache.

It samples token by token with its own sampler (not `model.generate`) so that it can record, for
each sampled id, the logprob under exactly the distribution it was drawn from (temperature-scaled
logits, masked to the allowed ids when constrained, top-p truncated when top_p < 1) and the
allowed-id set at every position. See `engines/base.py` for the contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rollout_workers.config import EngineConfig
from rollout_workers.engines.base import active_choices, decode_response, derive_seed, stop_token_ids
from rollout_workers.engines.constraint import (
    ChoiceConstraint,
    VocabTrie,
    choice_token_budget,
    token_bytes_table,
)
from rollout_workers.types import Generation
from weightsync.adapter import AdapterSpec, read_adapter_dir, wire_name
from weightsync.group import GroupSpec, WeightGroup
from weightsync.ipc import Handover, open_handover
from weightsync.protocol import receive_weights, release_cached_memory


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def sampling_logprobs(
    logits: torch.Tensor, *, temperature: float, top_p: float, allowed: Sequence[Sequence[int] | None]
) -> torch.Tensor:
    """Log-probabilities of the distribution to sample from. logits: [B, V] -> [B, V] float32.

    Order (as vLLM): constraint mask on the raw logits, temperature (skipped when 0 = greedy),
    top-p truncation; disallowed ids get -inf. Row b is unconstrained when allowed[b] is None.
    """
    scores = logits.float()
    if any(a is not None for a in allowed):
        mask = torch.zeros_like(scores, dtype=torch.bool)
        for b, ids in enumerate(allowed):
            if ids is None:
                mask[b] = True
            elif ids:
                mask[b, torch.as_tensor(list(ids), device=scores.device)] = True
        scores = scores.masked_fill(~mask, float("-inf"))
    if temperature > 0:
        scores = scores / temperature
    if top_p < 1.0:
        probs, order = scores.softmax(-1).sort(-1, descending=True)
        drop_sorted = probs.cumsum(-1) - probs >= top_p  # keep while the mass above is < top_p (as vLLM)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.log_softmax(-1)


class HFEngine:
    """`Engine` on transformers. Stateless between calls except for the loaded weights."""

    def __init__(self, model_path: str, cfg: EngineConfig):
        from transformers import AutoTokenizer

        self._cfg = cfg
        self.device = _resolve_device(cfg.device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = self._load(model_path)
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config.eos_token_id)
        self._pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        )
        self._vocab: VocabTrie | None = None

    def _load(self, path: str):
        from transformers import AutoModelForCausalLM

        dtype = "auto" if self._cfg.dtype == "auto" else getattr(torch, self._cfg.dtype)
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()

    @property
    def vocab_trie(self) -> VocabTrie:
        if self._vocab is None:
            table = token_bytes_table(self.tokenizer, self.model.config.vocab_size)
            self._vocab = VocabTrie(table)
        return self._vocab

    def reload_weights(self, path: str) -> None:
        self.model = self._load(path)
        self._adapter_spec = None  # a full reload replaces base and adapter alike

    weight_group_ranks = 1
    """Members this engine contributes to the weight-sync group (it is one process)."""

    # ---- colocated placement (`rollout_workers.colocation`) --------------------------------------

    def sleep(self, level: int) -> None:
        """Give the device to the learner: the weights go to host memory (at either level: an HF
        model has no cheap way to discard and re-create its weights); nothing moves on CPU."""
        if self.device.type != "cpu":
            self.model.to("cpu")
            release_cached_memory()

    def wake_up(self, tags: list[str]) -> None:
        if "weights" in tags and self.device.type != "cpu":
            self.model.to(self.device)

    @torch.no_grad()
    def receive_handover(self, handovers: list[Handover]) -> int:
        """Copy the weights of an in-place handover (one engine rank: handovers[0]) into the model;
        a tied lm_head shares the embedding's parameter and is updated with it."""
        [handover] = handovers
        params = dict(self.model.named_parameters())
        count = 0
        for bucket in open_handover(handover):
            for name, tensor in bucket:
                if name not in params:
                    raise KeyError(f"the handover sent {name!r}, which this model does not have")
                params[name].copy_(tensor)
                count += 1
        if count != len(params):
            raise RuntimeError(f"the handover loaded {count} of the model's {len(params)} parameters")
        return count

    def join_weight_group(self, spec: GroupSpec, base_rank: int) -> None:
        """Join `spec`'s group as `base_rank` (blocks until every member joined)."""
        self.leave_weight_group()
        self._group = WeightGroup(spec, base_rank, device=self.device if self.device.type == "cuda" else None)

    @torch.no_grad()
    def receive_weights(self) -> int:
        """Copy one broadcast set of weights into the model in place (collective with the sender);
        a tied lm_head shares the embedding's parameter and is updated with it."""
        group = getattr(self, "_group", None)
        if group is None:
            raise RuntimeError("receive_weights before join_weight_group")
        params = dict(self.model.named_parameters())
        count = 0
        try:
            for bucket in receive_weights(group):
                for name, tensor in bucket:
                    if name not in params:
                        raise KeyError(f"weight sync sent {name!r}, which this model does not have")
                    params[name].copy_(tensor)
                    count += 1
        except Exception:
            # every parameter still holds a whole tensor (old or new): the model stays usable
            # until the driver reloads it; the group is aborted so the sender stops waiting
            self._group = None
            group.abort()
            raise
        finally:
            release_cached_memory()
        if count != len(params):
            raise RuntimeError(f"weight sync loaded {count} of the model's {len(params)} parameters")
        return count

    def leave_weight_group(self) -> None:
        group, self._group = getattr(self, "_group", None), None
        if group is not None:
            group.close()

    # ---- LoRA adapters (learner.lora: only the adapter travels; the base stays as loaded) -------

    def load_adapter(self, path: str) -> int:
        """Apply the peft adapter directory at `path` on the base weights (replacing the previous
        adapter); returns the number of adapter tensors loaded."""
        tensors, spec = read_adapter_dir(path)
        return self._apply_adapter(tensors, spec)

    @torch.no_grad()
    def receive_adapter(self, spec: AdapterSpec) -> int:
        """Receive one broadcast adapter (collective with the sender) and apply it as `load_adapter`."""
        group = getattr(self, "_group", None)
        if group is None:
            raise RuntimeError("receive_adapter before join_weight_group")
        try:
            tensors = {name: t.clone() for bucket in receive_weights(group) for name, t in bucket}
        except Exception:
            self._group = None  # the model is untouched (the adapter is applied once whole)
            group.abort()
            raise
        finally:
            release_cached_memory()
        return self._apply_adapter(tensors, spec)

    @torch.no_grad()
    def _apply_adapter(self, tensors: dict[str, torch.Tensor], spec: AdapterSpec) -> int:
        """Wrap the base in peft LoRA layers of `spec` (once per spec) and copy `tensors` into them;
        every adapter parameter must be covered (a partial adapter would mix two versions)."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        if getattr(self, "_adapter_spec", None) != spec:
            base = self.model.unload() if getattr(self, "_adapter_spec", None) is not None else self.model
            peft_cfg = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.target_modules),
                                  lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
            self.model = get_peft_model(base, peft_cfg, autocast_adapter_dtype=False).eval()
            self._adapter_spec = spec
        expected = {wire_name(n) for n, _ in self.model.named_parameters() if ".lora_" in n}
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
            raise KeyError(f"the adapter does not fit this engine's LoRA layers (missing {missing[:3]}, "
                           f"unexpected {extra[:3]})")
        result = set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in tensors.items()})
        if result.unexpected_keys:
            raise KeyError(f"peft did not place adapter tensors {result.unexpected_keys[:3]}")
        return len(tensors)

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        choices: list[list[str]] | None = None,
    ) -> list[Generation]:
        seeds = [derive_seed(seed, i) for i in range(len(prompts))]
        return self.generate_seeded(prompts, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                    seeds=seeds, choices=choices)

    @torch.inference_mode()
    def generate_seeded(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seeds: list[int],
        choices: list[list[str]] | None = None,
    ) -> list[Generation]:
        """`generate` with each request's own seed given (`seeds[i]` seeds request i's sampler):
        the batch the async loop's requests are served in (engines/async_batch.py)."""
        if not prompts:
            return []
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        rows = active_choices(choices, len(prompts))
        constraints = [ChoiceConstraint(self.vocab_trie, c, self.stop_ids) if c else None for c in rows]
        limits = [choice_token_budget(c) if c else max_tokens for c in rows]
        gens = [torch.Generator(self.device).manual_seed(s) for s in seeds]
        out_ids: list[list[int]] = [[] for _ in prompts]
        out_lp: list[list[float]] = [[] for _ in prompts]
        out_allowed: list[list[tuple[int, ...]]] = [[] for _ in prompts]
        finished = [False] * len(prompts)
        logits, state = self._prefill(prompts)
        for step in range(max(limits)):
            allowed = [
                self._allowed(c) if c is not None and not f else None for c, f in zip(constraints, finished)
            ]
            logp = sampling_logprobs(logits, temperature=temperature, top_p=top_p, allowed=allowed)
            next_ids = self._draw(logp, temperature, gens, finished)
            for b, tid in enumerate(next_ids):
                if finished[b]:
                    continue
                out_ids[b].append(tid)
                out_lp[b].append(float(logp[b, tid]))
                if constraints[b] is not None:
                    out_allowed[b].append(allowed[b])  # type: ignore[arg-type]
                    constraints[b].advance(tid)
                finished[b] = tid in self.stop_ids or len(out_ids[b]) >= limits[b]
            if all(finished):
                break
            logits, state = self._decode(next_ids, state)
        return [
            self._generation(out_ids[b], out_lp[b], out_allowed[b] if constraints[b] else None)
            for b in range(len(prompts))
        ]

    def _allowed(self, constraint: ChoiceConstraint) -> tuple[int, ...]:
        # A dead end (no token continues any choice) can only stop; never an empty distribution.
        return constraint.allowed() or self.stop_ids

    def _draw(self, logp: torch.Tensor, temperature: float, gens, finished) -> list[int]:
        if temperature <= 0:
            return logp.argmax(-1).tolist()
        probs = logp.exp()
        return [
            self._pad_id if done else int(torch.multinomial(probs[b], 1, generator=gens[b]))
            for b, done in enumerate(finished)
        ]

    def _prefill(self, prompts: list[list[int]]):
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            mask[b, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1, :], (out.past_key_values, mask, positions[:, -1])

    def _decode(self, next_ids: list[int], state):
        cache, mask, last_pos = state
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        positions = (last_pos + 1).unsqueeze(1)
        ids = torch.as_tensor(next_ids, dtype=torch.long, device=self.device).unsqueeze(1)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        return out.logits[:, -1, :], (out.past_key_values, mask, positions[:, 0])

    def _generation(self, ids: list[int], lps: list[float], allowed) -> Generation:
        stopped = bool(ids) and ids[-1] in self.stop_ids
        return Generation(
            token_ids=tuple(ids),
            logprobs=tuple(lps),
            text=decode_response(self.tokenizer, ids, self.stop_ids),
            finish_reason="stop" if stopped else "length",
            allowed_token_ids=tuple(allowed) if allowed is not None else None,
        )
