"""Where the learner ranks and the rollout engines run (`ray.placement`), as pure rules: which
combinations a colocated run refuses (each message names the fix), the sync transport it
defaults to, and the placement bundles of one engine with the learner ranks that share its
devices. Ray is not imported here (`deploy.topology` reserves the bundles, `deploy.colocation`
runs the phases).

Colocated: engine w's tensor-parallel rank j shares one device slot (one placement bundle: a
whole GPU on a cluster, CPUs on a laptop) with learner rank w x tp + j. The two take turns on the
device, so nothing may overlap them: no rollout in flight while the learner trains
(rollout.max_staleness 0), no worker that joins mid-run without a learner rank beside it
(rollout.num_workers fixed), and exactly one learner rank per engine rank.
"""

from __future__ import annotations

from typing import Any

TrainConfig = Any
"""deploy.config.TrainConfig (not imported: deploy.config imports these rules)."""


def derive_sync_method(data: dict[str, Any]) -> dict[str, Any]:
    """A colocated config that names no sync.method gets `handover` (the engines' devices are the
    learner's: the weights hand over in place); everything else is left as written."""
    ray, sync = data.get("ray", {}), data.get("sync", {})
    if not isinstance(ray, dict) or not isinstance(sync, dict):
        return data  # already models (a validated config re-validated) or malformed: field validation reports
    if ray.get("placement") == "colocated" and "method" not in sync:
        return {**data, "sync": {**sync, "method": "handover"}}
    return data


def colocation_errors(cfg: TrainConfig) -> list[str]:
    """Every reason `cfg`'s placement and sync transport cannot run, each naming the fix (empty
    when it can)."""
    r, rollout, tp = cfg.ray, cfg.rollout, cfg.engine.tensor_parallel_size
    if r.placement != "colocated":
        if cfg.sync.method == "handover":
            return [("sync.method=handover hands the weights to an engine on the learner rank's own device, "
                     "which needs ray.placement=colocated; set it, or sync.method=broadcast")]
        return []
    errors = []
    if rollout.max_staleness >= 1:
        errors.append(f"ray.placement=colocated takes turns on each device (generate, then train), but "
                      f"rollout.max_staleness={rollout.max_staleness} overlaps the next rollout with the update; "
                      "set rollout.max_staleness=0, or ray.placement=disaggregated")
    if rollout.num_workers == "auto":
        errors.append("ray.placement=colocated pairs every engine rank with a learner rank for the whole run, but "
                      "rollout.num_workers=auto adds and removes workers; set rollout.num_workers to a number")
    elif r.num_learners != rollout.num_workers * tp:
        errors.append(f"ray.placement=colocated puts one learner rank beside each engine rank, so ray.num_learners "
                      f"must be rollout.num_workers x engine.tensor_parallel_size = {rollout.num_workers} x {tp} = "
                      f"{rollout.num_workers * tp}, not {r.num_learners}; set ray.num_learners="
                      f"{rollout.num_workers * tp}")
    if cfg.sync.method == "broadcast":
        errors.append("sync.method=broadcast builds a process group between the learner and the engines, which "
                      "NCCL refuses with two ranks on one GPU; with ray.placement=colocated use sync.method=handover "
                      "(the default there: remove sync.method) or object_store")
    gpus = (r.learner_gpus, r.rollout_gpus)
    if any(gpus) and not all(0 < g < 1 for g in gpus):
        errors.append(f"ray.placement=colocated shares each GPU between a learner rank and an engine rank, so "
                      f"ray.learner_gpus and ray.rollout_gpus are both fractions of it (e.g. 0.5 and 0.5), not "
                      f"{r.learner_gpus:g} and {r.rollout_gpus:g}; or both 0 on CPU")
    elif sum(gpus) > 1 + 1e-9:
        errors.append(f"ray.learner_gpus + ray.rollout_gpus = {sum(gpus):g} exceeds the one GPU they share under "
                      "ray.placement=colocated; lower them so they sum to at most 1")
    if rollout.loop == "async":
        errors.append("ray.placement=colocated puts the engine to sleep between rollouts, which the async agent "
                      "loop's engine does not support yet; set rollout.loop=lockstep")
    if cfg.sync.verify:
        errors.append("sync.verify samples on the engines and re-scores on the learner right after a sync, when "
                      "under ray.placement=colocated only one side holds the device; set sync.verify=false (every "
                      "step's mismatch/* metrics measure the same gap)")
    lora = cfg.learner.lora
    if cfg.sync.method == "handover" and lora.enabled and not lora.merge_on_sync:
        errors.append("sync.method=handover hands over full weights; with learner.lora set "
                      "learner.lora.merge_on_sync=true (the merged weights travel) or sync.method=object_store")
    return errors


def slot_bundle(cfg: TrainConfig, rank: int) -> dict[str, float]:
    """The placement bundle of engine rank `rank` (0..tp-1) of one colocated engine: the learner
    rank's CPUs (plus the rollout worker's on rank 0, where the worker itself runs) and, on a
    cluster, the whole GPU the two share."""
    r = cfg.ray
    bundle = {"CPU": r.learner_cpus + (r.rollout_cpus if rank == 0 else 0.0)}
    if r.learner_gpus or r.rollout_gpus:
        bundle["GPU"] = 1.0
    return bundle


def engine_bundles(cfg: TrainConfig) -> list[dict[str, float]]:
    """One colocated engine's placement group: a bundle per tensor-parallel rank."""
    return [slot_bundle(cfg, j) for j in range(cfg.engine.tensor_parallel_size)]


def learner_slot(cfg: TrainConfig, rank: int) -> tuple[int, int]:
    """(engine, bundle) where learner rank `rank` runs under colocated placement."""
    tp = cfg.engine.tensor_parallel_size
    return rank // tp, rank % tp


def colocated_gpus(cfg: TrainConfig) -> int:
    """Whole GPUs a colocated run reserves: one per engine rank (0 on CPU)."""
    r = cfg.ray
    return cfg.rollout.initial_workers * cfg.engine.tensor_parallel_size if (r.learner_gpus or r.rollout_gpus) else 0
