"""`eval --retrieval on` of a finished UniSkill run (deploy/eval_skills.py): the skill slot comes from
the run's own bank (RUN/skillbank, served from a copy), with the training retrieval rule; the
run's files are left untouched. Real private Redis server, hashing embedder."""

from pathlib import Path

import pytest

from deploy.config import TrainConfig
from deploy.config_loading import ConfigError
from deploy.eval_skills import RunBankSkills
from envs.config import EnvConfig
from envs.tasks import eval_tasks
from skillbank_service.config import SkillBankConfig
from skillbank_service.service import SkillBankService
from skillbank_service.types import CriticVerdict, ScoredProposal

PASS = CriticVerdict(op_reasonable=True, content_supported=True, passed=True, critic="rule")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_retrieval_on_reads_the_runs_bank_and_leaves_it_untouched(tmp_path):
    tasks = eval_tasks(EnvConfig(), "valid_unseen", 8)
    kinds = sorted({t.task_type for t in tasks})
    assert len(kinds) >= 2
    run = tmp_path / "run"
    bank = SkillBankService(SkillBankConfig(data_dir=str(run / "skillbank"), key_prefix="evalrun",
                                            embedding_model="hashing"))
    text = "Open every closed receptacle before searching the countertops again."
    bank.apply([ScoredProposal(candidate_id="c1", step=10, op="add", task_type=kinds[0], text=text,
                               source_trajectory_ids=("t1",), r_align=0.1, delta_plus=0.2, delta_minus=0.1,
                               coverage_ok=True, verdict=PASS, r_fmt_ok=True)])
    bank.shutdown()
    before = _files(run / "skillbank")
    cfg = TrainConfig.model_validate({"run": {"name": "evalrun", "output_dir": str(run)},
                                      "rollout": {"group_size": 4},
                                      "uniskill": {"enabled": True, "bank": {"embedding_model": "hashing"}}})
    skills = RunBankSkills(cfg)
    shown = skills.retrieve(tasks, evaluation=True)
    assert shown == {t.task_id: (text if t.task_type == kinds[0] else None) for t in tasks}
    assert {tid for tid, (sid, _) in skills.shown.items() if sid is not None} == {
        t.task_id for t in tasks if t.task_type == kinds[0]}
    assert _files(run / "skillbank") == before  # served from a copy

    with pytest.raises(ConfigError, match="holds no skill bank"):
        RunBankSkills(cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": str(tmp_path / "x")})}
                                     )).retrieve(tasks)
    with pytest.raises(ConfigError, match="uniskill.enabled=true"):
        RunBankSkills(TrainConfig())
