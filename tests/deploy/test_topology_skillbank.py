"""The skill-bank actor declares its embedder's device to Ray: "cuda" reserves a GPU share, "cpu"
(the default) none, and a cuda bank that cannot get a GPU fails naming the setting. A real local
Ray cluster that declares one logical GPU (this machine has none; the hashing embedder never
touches the device) and the bank's private redis-server. The start-up resource check counts it."""

import pytest

from skillbank_service.config import SkillBankConfig

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.slow]


def test_embedding_device_decides_the_actors_gpu():
    import ray

    from deploy.config_loading import load_config
    from deploy.skillbank_actor import get_or_create_skillbank, shutdown_skillbank, skillbank_gpus
    from deploy.topology import check_resources

    assert skillbank_gpus(SkillBankConfig()) == 0.0
    assert skillbank_gpus(SkillBankConfig(embedding_device="cuda", embedding_gpus=0.25)) == 0.25
    with pytest.raises(ValueError, match="embedding_device"):
        SkillBankConfig(embedding_device="gpu")

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, namespace="test_bank_gpu")
    banks = []
    try:
        banks.append(get_or_create_skillbank(SkillBankConfig(embedding_model="hashing"), "bank_cpu"))
        assert ray.available_resources().get("GPU", 0.0) == 1.0
        cuda = SkillBankConfig(embedding_model="hashing", embedding_device="cuda")
        banks.append(get_or_create_skillbank(cuda, "bank_cuda"))
        assert ray.available_resources().get("GPU", 0.0) == 0.0  # the bank holds the GPU
        assert get_or_create_skillbank(cuda, "bank_cuda")._actor_id == banks[-1]._actor_id  # existing: no check
        with pytest.raises(RuntimeError, match=r"embedding_device='cuda' asks for 1 GPU.*has 0 GPU free"):
            get_or_create_skillbank(cuda, "bank_cuda_2")

        # the start-up check counts the bank's GPU with the engines'
        cfg = load_config(None, ["uniskill.enabled=true", "uniskill.bank.embedding_device=cuda", "ray.rollout_gpus=1"])
        with pytest.raises(RuntimeError, match=r"needs 2 \(rollout\.num_workers x ray\.rollout_gpus \+ "
                                               r"uniskill\.bank\.embedding_gpus"):
            check_resources(cfg, with_learner=False)
        check_resources(load_config(None, ["uniskill.enabled=true", "ray.rollout_gpus=1"]), with_learner=False)
    finally:
        for bank in banks:
            shutdown_skillbank(bank)
        ray.shutdown()
