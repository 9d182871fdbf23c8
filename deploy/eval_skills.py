"""`eval --retrieval on|off` for a finished UniSkill run (docs/algorithms.md S8): the actor's skill
slot filled from the run's own skill bank, or left empty (the paper's retrieval-off analysis).

The bank is the one the run built: a run whose bank had no configured `uniskill.bank.url` /
`data_dir` kept its private Redis server's AOF in RUN/skillbank (`deploy.stages.uniskill.make_stage`).
That directory is copied to a temporary one and served by a private server there, so the run's own
files are never touched; retrieval is the training rule (`retrieve_skills`: top-1 of the task's
type for its instruction, with the bank's embedder). The bank is the run's final one, whatever
checkpoint is evaluated. The skills shown are written next to the result (eval/<label>.skills.json).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from deploy.config import TrainConfig
from deploy.config_loading import ConfigError
from deploy.stages.uniskill_glue import retrieve_skills
from envs.types import TaskSpec

Retrieval = Literal["on", "off"]


def run_bank_dir(cfg: TrainConfig) -> Path:
    """Where the run's private skill-bank server kept its data."""
    bank = cfg.uniskill.bank
    return Path(bank.data_dir) if bank.data_dir is not None else Path(cfg.run.output_dir) / "skillbank"


class RunBankSkills:
    """`retrieve(tasks, evaluation=True)` -> task_id -> skill text, from a finished run's bank (the
    interface `deploy.trainer.run_evaluation` reads); `shown` keeps every retrieval for the record."""

    def __init__(self, cfg: TrainConfig):
        if not cfg.uniskill.enabled:
            raise ConfigError("--retrieval on needs a UniSkill run's config (uniskill.enabled=true); pass "
                              "RUN/config.resolved.json of a UniSkill run")
        self.cfg, self.shown = cfg, {}

    def retrieve(self, tasks: Sequence[TaskSpec], *, evaluation: bool = True) -> dict[str, str | None]:
        from skillbank_service.service import SkillBankService

        bank_cfg = self.cfg.uniskill.bank
        namespace = self.cfg.ray.namespace or self.cfg.run.name
        if bank_cfg.key_prefix == type(bank_cfg).model_fields["key_prefix"].default:
            bank_cfg = bank_cfg.model_copy(update={"key_prefix": namespace})  # as get_or_create_skillbank
        with tempfile.TemporaryDirectory(prefix="eval-skillbank-") as tmp:
            if bank_cfg.url is None:
                source = run_bank_dir(self.cfg)
                if not source.is_dir():
                    raise ConfigError(f"--retrieval on: {source} holds no skill bank (the run's private server keeps "
                                      "its data there); evaluate a UniSkill run directory, or use --retrieval off")
                data = Path(tmp) / "bank"
                shutil.copytree(source, data)
                bank_cfg = bank_cfg.model_copy(update={"data_dir": str(data)})
            service = SkillBankService(bank_cfg, expect_existing=bank_cfg.url is None)
            try:
                skills = retrieve_skills(service, tasks, self.cfg.uniskill)
            finally:
                service.shutdown()
        texts = {tid: s.text if s is not None else None for tid, s in skills.items()}
        self.shown.update({tid: (s.skill_id if s is not None else None, texts[tid]) for tid, s in skills.items()})
        return texts


def run_eval_with_retrieval(cfg: TrainConfig, model_path: str, *, retrieval: Retrieval, label: str = "eval"):
    """Evaluate `model_path` on the fixed set with the run's bank in the skill slot (on) or none (off);
    writes eval/<label>[-<split>].json per split (and eval/<label>.skills.json with on)."""
    from deploy.runner import run_eval_command

    skills = RunBankSkills(cfg) if retrieval == "on" else None
    results = run_eval_command(cfg, model_path, label=label, skills=skills)  # type: ignore[arg-type]
    if skills is not None:
        (Path(cfg.run.output_dir) / "eval" / f"{label}.skills.json").write_text(json.dumps(
            {tid: {"skill_id": sid, "text": text} for tid, (sid, text) in sorted(skills.shown.items())}, indent=2))
    return results
