"""LearnerWorker: owns the policy (a DeepSpeed engine or plain torch), trains GRPO on turn rows
(with SMRC-SD's routed distillation and UniSkill's proposer loss when configured), scores
responses, exports HF weights for the rollout engines, checkpoints.

A plain class: `deploy/` wraps it in a Ray actor; tests construct it directly. It orchestrates
one step; the concerns live in their own modules:
- `learner.actor`: GRPO advantages, the no-grad pass at theta_old, the actor's micro-batch loss;
- `learner.teacher_pass`: SMRC-SD's teacher log-prob pass (its loss: `learner.distill`);
- `learner.proposer_pass`, `learner.proposer_loss`: UniSkill's R_align scoring and rewards, and
  its proposer loss;
- `learner.sharding`: which rank trains / scores which rows, in which micro-batches;
- `learner.checkpoint`, `learner.collectives`: IO and the cross-rank sums.

Extra loss terms plug into the update through two seams (`learner.types`): an `ExtraLoss` rides
on the actor's micro-batches (SMRC-SD's "sd"), an `AuxiliaryLoss` brings rows of its own, trained
in the same optimiser steps (UniSkill's "prop").

Data parallelism: every rank receives the SAME rows (or, with `owners`, the same rows with the
other ranks' token arrays blank). Advantages are computed over all rows (so group statistics never
depend on sharding), the (seeded) row order is split into mini-batches, and each rank trains a
length-sorted 1/W share of each mini-batch (its own episodes' rows with `owners`). Every loss denominator is
computed over the whole mini-batch, so the update is invariant to the number of ranks and
micro-batches (docs/algorithms.md S7.9). All ranks run the same number of forward/backward calls
(short ranks run zero-weight padding micro-batches) so ZeRO collectives line up.

UniSkill (docs/algorithms.md S3, S4; `cfg.proposer`): `train_step` also takes proposer samples
and R_align requests; see `learner.proposer_pass` for how they are scored and rewarded and
`learner.proposer_loss` for how they are trained.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence

import torch

from learner.actor import (
    ROW_WEIGHTINGS,
    StepData,
    actor_micro_loss,
    denominators,
    old_and_ref_logprobs,
    row_advantages,
    row_scores,
)
from learner.algos import staleness
from learner.backends import build_backend, build_reference, load_causal_lm, weight_dtype
from learner.batch import collate_rows, select_rows
from learner.checkpoint import (
    export_adapter_dir,
    export_hf_dir,
    load_training_state,
    merged_export_tensors,
    save_training_state,
)
from learner.collectives import all_reduce_max, all_reduce_sums, all_reduce_tensor, barrier
from learner.config import LearnerConfig
from learner.logprobs import ResponseScores, response_logprobs
from learner.lora import adapter_spec, adapters_disabled
from learner.metrics import OldPass, StageClock, Tally, step_metrics
from learner.mismatch import ZERO_SUMS, mismatch_metrics
from learner.off_policy import behaviour_weight_metrics, behaviour_weight_sums, staleness_metrics
from learner.proposer_loss import ProposerLoss, proposal_metrics
from learner.proposer_pass import ProposalData, UniPass, check_uniskill_inputs, proposal_data, uniskill_pass
from learner.sharding import owned_rows, shard_micro_batches
from learner.teacher_pass import TeacherPass, build_sd_loss, sd_metrics, teacher_logprobs
from learner.types import (
    AlignRequest,
    AuxiliaryLoss,
    Chunk,
    ExtraLoss,
    ProposalRow,
    StageSeconds,
    StepMetrics,
    TokenBatch,
    TrainRow,
)
from learner.weight_sender import WeightSender
from weightsync.group import GroupSpec


def _load_model(path: str, dtype: torch.dtype, device: torch.device, zero3: dict | None) -> torch.nn.Module:
    return load_causal_lm(path, dtype=dtype, device=device, zero3_config=zero3)


def _ref_dtype(cfg: LearnerConfig) -> torch.dtype:
    return torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32


class LearnerWorker:
    """The policy's owner. `train_step(rows)` runs one GRPO step and returns StepMetrics;
    `score(rows)` gives current-policy response log-probs; `export_weights(dir)` writes an HF
    directory for the engines; `save_checkpoint` / `load_checkpoint` persist model, optimiser,
    version and RNG. With kl_coef > 0 a frozen copy of the initial weights is the reference (with
    learner.lora: the base with the adapters disabled).
    `extra_losses` are added to the GRPO loss per micro-batch (see `ExtraLoss`)."""

    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
        rendezvous_file: str | None = None,
        local_rank: int | None = None,
        extra_losses: Sequence[ExtraLoss] = (),
        collective_timeout_s: float | None = None,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.extra_losses = list(extra_losses)
        self.sd_loss = build_sd_loss(cfg.sd)
        if self.sd_loss is not None:
            self.extra_losses.append(self.sd_loss)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        loader = functools.partial(_load_model, model_path, weight_dtype(cfg))
        self.backend = build_backend(
            cfg,
            loader,
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            rendezvous_file=rendezvous_file,
            local_rank=local_rank,
            collective_timeout_s=collective_timeout_s,
        )
        prop = cfg.proposer
        self._needs_ref = cfg.kl_coef > 0 or (prop.enabled and prop.beta_kl > 0)
        ref_loader = functools.partial(_load_model, model_path, _ref_dtype(cfg))
        # with LoRA the reference is the policy's own base, adapters disabled (`_reference_logp`)
        separate_ref = self._needs_ref and not cfg.lora.enabled
        self.ref_model = build_reference(cfg, ref_loader, self.backend) if separate_ref else None
        self._model_path = model_path
        self._max_positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
        self._version = 0
        self._weight_sender = WeightSender(cfg, rank)

    def get_version(self) -> int:
        """Policy version = optimiser updates applied through `train_step` (restored on load)."""
        return self._version

    # -----------------------------------------------------------------------------------------
    # training

    def train_step(
        self,
        rows: Sequence[TrainRow],
        proposals: Sequence[ProposalRow] = (),
        align: Sequence[AlignRequest] = (),
        *,
        proposer_warmup: bool = False,
        owners: Sequence[int] | None = None,
    ) -> StepMetrics:
        """One GRPO step on `rows` (the same lists on every rank), jointly with UniSkill's proposer
        loss on `proposals` (docs/algorithms.md S3) rewarded with R_align from `align` (S4).

        `owners` (one rank per row, `learner.sharding.episode_owners`, the same on every rank):
        each rank trains and scores the rows it owns, so only their token arrays need be real;
        of the other rows it reads lengths, scores and keys alone (`deploy.step_rows.StepRows.shard`).
        None: the length stride of `learner.sharding`. Not with proposals (UniSkill's passes read
        every row).

        `proposer_warmup` (decided by the driver's UniSkill stage for the whole step): proposals
        are rewarded with r_fmt only and `align` is ignored.
        Order: collate; one no-grad pass at theta_old (actor old/ref, SMRC-SD teacher, proposal
        old/ref, swapped-skill anchor turns); advantages (GRPO; R_align, composite reward and
        REINFORCE++ whitening over all proposals); then one optimiser step per actor mini-batch
        with L_actor + lambda_prop * L_prop backpropagated (proposals split evenly over them).
        """
        proposals, align = list(proposals), list(align)
        check_uniskill_inputs(self.cfg.proposer.enabled, rows, proposals, align)
        owner = self._owner(owners, len(rows), with_proposals=bool(proposals))
        warmup = proposer_warmup
        align = [] if warmup else align
        clock = StageClock()
        with clock("collate_s"):
            batch = collate_rows(rows, pad_token_id=self._pad_id)
            lag = staleness(batch.policy_version, self._version)  # raises on rows newer than this learner
            minis = self._mini_batches(batch.num_rows)
            shards = self._shards(batch, minis, owner)
        with clock("logprob_s"):
            old = self._old_pass(batch, shards)
            teacher = self._teacher_pass(rows, batch, minis, owner) if self.sd_loss is not None else None
            if self.sd_loss is not None and teacher is not None:
                self.sd_loss.set_teacher(teacher.teacher_logp, teacher.match, step=self._version)
            uni = self._uniskill_pass(rows, proposals, align) if proposals else None
        with clock("advantage_s"):
            advantages = row_advantages(self.cfg, batch)
            weights = ROW_WEIGHTINGS[self.cfg.row_weighting](batch)
            prop = None
            if uni is not None:
                prop = proposal_data(
                    proposals,
                    align,
                    uni,
                    cfg=self.cfg,
                    n_minis=len(minis),
                    warmup=warmup,
                    version=self._version,
                )
        with clock("update_s"):
            aux: list[AuxiliaryLoss] = []
            if prop is not None:
                aux.append(ProposerLoss(prop, cfg=self.cfg, backend=self.backend, rank=self.rank,
                                        world_size=self.world_size))  # fmt: skip
            data = StepData(batch=batch, old=old, advantages=advantages, weights=weights)
            tally = self._update(data, minis, shards, None if teacher is None else teacher.match, aux)
        self._version += 1
        return self._step_metrics(batch, old, advantages, tally, clock.stages(), teacher, prop, lag)

    def _mini_batches(self, num_rows: int) -> list[torch.Tensor]:
        """Row indices per optimiser step; the seeded order is identical on every rank."""
        if self.cfg.shuffle_rows:
            gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self._version)
            order = torch.randperm(num_rows, generator=gen)
        else:
            order = torch.arange(num_rows)
        return list(order.split(self.cfg.mini_batch_rows or num_rows))

    def _owner(self, owners: Sequence[int] | None, num_rows: int, *, with_proposals: bool) -> torch.Tensor | None:
        if owners is None:
            return None
        if with_proposals:
            raise ValueError("train_step: owners (rows dealt by episode) cannot come with proposals: UniSkill's "
                             "passes read every row; pass every row's tokens and owners=None")
        owner = torch.as_tensor(list(owners), dtype=torch.long)
        if len(owner) != num_rows or (num_rows and not bool(((owner >= 0) & (owner < self.world_size)).all())):
            raise ValueError(f"train_step: owners needs one rank in [0, {self.world_size}) per row "
                             f"({num_rows} rows, got {len(owner)} owners)")
        return owner

    def _shards(self, batch: TokenBatch, minis: list[torch.Tensor],
                owner: torch.Tensor | None = None) -> list[list[Chunk]]:
        """This rank's micro-batches of each mini-batch (`shard_micro_batches`)."""
        lengths = batch.attention_mask.sum(-1)
        return [
            shard_micro_batches(
                lengths,
                mini,
                rank=self.rank,
                world_size=self.world_size,
                micro_rows=self.cfg.micro_batch_rows,
                max_tokens=self.cfg.max_tokens_per_micro_batch,
                owner=owner,
            )
            for mini in minis
        ]

    def _policy_logprobs(self, micro: TokenBatch, *, with_entropy: bool) -> ResponseScores:
        with self.backend.autocast():
            return response_logprobs(
                self.backend.forward_module(),
                micro,
                temperature=self.cfg.temperature,
                with_entropy=with_entropy,
                chunk_size=self.cfg.logprob_chunk_size,
            )

    def _policy_logp(self, micro: TokenBatch) -> torch.Tensor:
        return self._policy_logprobs(micro, with_entropy=False).logp

    def _reference_logp(self) -> Callable[[TokenBatch], torch.Tensor] | None:
        """The reference's response log-probs (None without a KL term): the frozen copy, or with
        LoRA the policy's base with its adapters disabled (the same forward as the policy's, in
        the same precision, minus the adapters)."""
        if not self._needs_ref:
            return None
        cfg = self.cfg
        if cfg.lora.enabled:
            return self._base_logp
        ref = self.ref_model
        return lambda micro: response_logprobs(
            ref, micro, temperature=cfg.temperature, chunk_size=cfg.logprob_chunk_size
        ).logp

    def _base_logp(self, micro: TokenBatch) -> torch.Tensor:
        with adapters_disabled(self.backend.module):
            return self._policy_logp(micro)

    def _old_pass(self, batch: TokenBatch, shards: list[list[Chunk]]) -> OldPass:
        return old_and_ref_logprobs(
            self.cfg, batch, shards, policy=self._policy_logprobs, reference=self._reference_logp()
        )

    def _teacher_pass(
        self, rows: Sequence[TrainRow], batch: TokenBatch, minis: list[torch.Tensor],
        owner: torch.Tensor | None = None,
    ) -> TeacherPass:
        lengths, micro = batch.attention_mask.sum(-1), self.cfg.micro_batch_rows
        owned = [
            owned_rows(lengths, minis, rank=r, world_size=self.world_size, micro_rows=micro,
                       max_tokens=self.cfg.max_tokens_per_micro_batch, owner=owner)
            for r in range(self.world_size)
        ]
        return teacher_logprobs(
            rows, batch, owned, rank=self.rank, micro_rows=micro, pad_token_id=self._pad_id,
            policy=self._policy_logp, max_tokens=self.cfg.max_tokens_per_micro_batch,
        )  # fmt: skip

    def _uniskill_pass(
        self, rows: Sequence[TrainRow], proposals: list[ProposalRow], align: list[AlignRequest]
    ) -> UniPass:
        return uniskill_pass(
            rows, proposals, align, cfg=self.cfg, rank=self.rank, world_size=self.world_size,
            pad_token_id=self._pad_id, tokenizer=self.tokenizer, max_positions=self._max_positions,
            policy=self._policy_logp, reference=self._reference_logp(),
            reduce=functools.partial(all_reduce_tensor, world_size=self.world_size, device=self.backend.device),
        )  # fmt: skip

    def _update(
        self,
        data: StepData,
        minis: list[torch.Tensor],
        shards: list[list[Chunk]],
        match: torch.Tensor | None,
        aux: Sequence[AuxiliaryLoss] = (),
    ) -> Tally:
        """PPO epochs x mini-batches; one optimiser step per mini-batch, micro-batch accumulation:
        the actor's micro-batches (with the `ExtraLoss` hooks), then each `AuxiliaryLoss`'s
        micro-batches of that mini-batch (one step for all losses, S3). `match` (N,): rows with
        a teacher prompt (the "matched_tokens" denominator), None without a teacher pass."""
        tally = Tally()
        for epoch in range(self.cfg.ppo_epochs):
            for k, (mini, chunks) in enumerate(zip(minis, shards)):
                den = denominators(self.cfg, data, mini, match)
                actor = functools.partial(
                    actor_micro_loss, self.cfg, data, den=den, tally=tally, policy=self._policy_logprobs,
                    device=self.backend.device, extra_losses=self.extra_losses, first_pass=epoch == 0,
                )  # fmt: skip
                work: list[tuple[Callable[[torch.Tensor, bool], torch.Tensor], torch.Tensor, bool]]
                work = [(actor, idx, real) for idx, real in chunks]
                for hook in aux:
                    loss_of = functools.partial(self._auxiliary_loss, hook, k=k, tally=tally)
                    work += [(loss_of, idx, real) for idx, real in hook.micro_batches(k)]
                for j, (loss_of, idx, real) in enumerate(work):
                    self.backend.backward(loss_of(idx, real), is_boundary=j == len(work) - 1)
                tally.grad_norms.append(self.backend.step())
        for hook in (*self.extra_losses, *aux):
            sums = getattr(hook, "sums", None)
            for key, value in (sums() if callable(sums) else {}).items():
                tally.add(f"{hook.name}/{key}", value)
        return tally

    @staticmethod
    def _auxiliary_loss(
        hook: AuxiliaryLoss, idx: torch.Tensor, real: bool, *, k: int, tally: Tally
    ) -> torch.Tensor:
        loss = hook(idx, real, k)
        tally.add("loss", loss.detach())
        return loss

    # -----------------------------------------------------------------------------------------
    # metrics

    def _step_metrics(
        self,
        batch: TokenBatch,
        old: OldPass,
        advantages: torch.Tensor,
        tally: Tally,
        seconds: StageSeconds,
        teacher: TeacherPass | None,
        prop: ProposalData | None,
        lag: torch.Tensor,
    ) -> StepMetrics:
        if old.recomputed:  # else the first update pass measured the mismatch (`actor_micro_loss`)
            tally.add_mismatch(batch.sampler_logp, old.old_logp, batch.response_mask * old.owned[:, None].float())
        local = {**ZERO_SUMS, **tally.sums, **old.sums(batch, kl_type=self.cfg.kl_type)}
        off_policy = self.cfg.off_policy != "none"
        if off_policy:
            is_sums, is_max = behaviour_weight_sums(self.cfg, batch, old)
            local |= is_sums
        sums = all_reduce_sums(local, world_size=self.world_size, device=self.backend.device)
        extra = staleness_metrics(lag)
        extra |= mismatch_metrics(sums, all_reduce_max(tally.mismatch_max, world_size=self.world_size,
                                                       device=self.backend.device))
        if off_policy:
            is_max = all_reduce_max(is_max, world_size=self.world_size, device=self.backend.device)
            extra |= behaviour_weight_metrics(sums, is_max)
        if prop is not None:
            extra |= proposal_metrics(prop, sums, steps=max(len(tally.grad_norms), 1))
        if teacher is not None:
            extra |= sd_metrics(teacher, batch, sums)
        metrics = step_metrics(
            batch,
            sums,
            grad_norms=tally.grad_norms,
            scores=row_scores(self.cfg, batch),
            advantages=advantages,
            lr=self.backend.lr(),
            policy_version=self._version,
            seconds=seconds,
            extra_metrics=extra,
        )
        return metrics if prop is None else metrics.model_copy(update={"proposal_scores": prop.scores})

    # -----------------------------------------------------------------------------------------
    # scoring, export, checkpoints

    @torch.no_grad()
    def score(self, rows: Sequence[TrainRow]) -> list[list[float]]:
        """Current-policy log-probs of each row's response ids (at the rollout temperature, over
        the allowed ids where constrained). Every rank must call it with the same rows."""
        batch = collate_rows(rows, pad_token_id=self._pad_id)
        out: list[list[float]] = [[] for _ in rows]
        chunks = shard_micro_batches(
            batch.attention_mask.sum(-1), torch.arange(batch.num_rows), rank=0, world_size=1,
            micro_rows=self.cfg.micro_batch_rows, max_tokens=self.cfg.max_tokens_per_micro_batch,
        )  # fmt: skip
        for idx in (idx for idx, real in chunks if real):
            logp = self._policy_logprobs(select_rows(batch, idx), with_entropy=False).logp.float().cpu()
            for k, i in enumerate(idx.tolist()):
                out[i] = logp[k, : len(rows[i].response_ids)].tolist()
        return out

    def export_weights(self, out_dir: str) -> str:
        """Write an HF directory (safetensors + config + tokenizer) that vLLM and transformers
        load; with LoRA the base with the adapters merged in. Every rank must call it (a
        collective under ZeRO-3); rank 0 writes."""
        tensors = merged_export_tensors(self.backend, rank=self.rank) if self.cfg.lora.enabled else None
        out = export_hf_dir(self.backend, self.tokenizer, out_dir, rank=self.rank, tensors=tensors)
        barrier(self.world_size)
        return str(out)

    def export_adapter(self, out_dir: str) -> str:
        """LoRA only: write a peft adapter directory (adapter_config.json naming the run's base
        model + adapter_model.safetensors) that peft and vLLM load on the base. Every rank must
        call it; rank 0 writes."""
        if not self.cfg.lora.enabled:
            raise ValueError("export_adapter needs learner.lora.enabled (a full-weight run has no adapter)")
        out = export_adapter_dir(self.backend, adapter_spec(self.cfg.lora), out_dir, rank=self.rank,
                                 base_model=self._model_path)
        barrier(self.world_size)
        return str(out)

    @property
    def syncs_adapter(self) -> bool:
        """Whether a weight sync sends the adapter alone (LoRA without lora.merge_on_sync)."""
        return self.cfg.lora.enabled and not self.cfg.lora.merge_on_sync

    def export_sync(self, out_dir: str) -> str:
        """What a weight sync through files sends: the adapter directory (`syncs_adapter`), else
        the HF directory (merged under LoRA)."""
        return self.export_adapter(out_dir) if self.syncs_adapter else self.export_weights(out_dir)

    def join_weight_group(self, spec: GroupSpec) -> None:
        """Rank 0 only: join the weight-sync group as its sender (`learner.weight_sender`)."""
        self._weight_sender.join(spec, self.backend.device)

    def broadcast_weights(self, wire_dtype: str | None = None, bucket_mb: float = 256.0) -> int:
        """Every rank calls it (gathers under ZeRO-3); rank 0 streams the current weights to the
        engines in buckets: every parameter, or with LoRA the adapter tensors alone (or the merged
        weights with lora.merge_on_sync). Returns the bytes rank 0 sent (0 on other ranks)."""
        what = "full" if not self.cfg.lora.enabled else "adapter" if self.syncs_adapter else "merged"
        stats = self._weight_sender.send(self.backend.module, wire_dtype=wire_dtype, bucket_mb=bucket_mb, what=what)
        return 0 if stats is None else stats.bytes

    def save_checkpoint(self, ckpt_dir: str) -> str:
        """Model + optimiser state + version + RNG (every rank calls it)."""
        save_training_state(self.backend, ckpt_dir, version=self._version)
        barrier(self.world_size)
        return ckpt_dir

    def load_checkpoint(self, ckpt_dir: str) -> int:
        """Restore what `save_checkpoint` wrote; returns the restored policy version."""
        self._version = load_training_state(self.backend, ckpt_dir)
        return self._version
