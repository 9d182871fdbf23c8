"""The learner's CUDA device comes from the GPUs Ray assigned (`learner.backends.cuda_ordinal`): pure,
with the environment variants Ray produces; no GPU needed."""

from __future__ import annotations

import pytest
import torch

from learner.backends import NOSET_VISIBLE_DEVICES, assigned_device, cuda_ordinal


@pytest.mark.parametrize("rank_gpu", ["0", "3", "7"])
def test_ray_default_gives_ordinal_zero_whatever_the_gpu(rank_gpu):
    # Ray sets CUDA_VISIBLE_DEVICES to the assigned GPU: the actor sees it as ordinal 0
    assert cuda_ordinal({"CUDA_VISIBLE_DEVICES": rank_gpu}, [rank_gpu], device_count=1) == 0


def test_several_assigned_gpus_take_the_first():
    assert cuda_ordinal({"CUDA_VISIBLE_DEVICES": "5,6"}, ["5", "6"], device_count=2) == 0


def test_a_shared_gpu_is_ordinal_zero_for_every_actor():
    # fractional GPUs: two actors on GPU 2 both see only GPU 2
    assert [cuda_ordinal({"CUDA_VISIBLE_DEVICES": "2"}, [2], device_count=1) for _ in range(2)] == [0, 0]


def test_visible_list_wider_than_the_assignment_uses_its_position():
    assert cuda_ordinal({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, ["6"], device_count=4) == 2
    assert cuda_ordinal({}, ["3"], device_count=8) == 3  # no variable: the id is the ordinal


def test_outside_ray_the_first_visible_gpu():
    assert cuda_ordinal({}, [], device_count=4) == 0
    assert cuda_ordinal({"CUDA_VISIBLE_DEVICES": "1,2"}, [], device_count=2) == 0


@pytest.mark.parametrize("value", ["1", "true"])
def test_noset_visible_devices_is_refused_with_the_fix(value):
    with pytest.raises(RuntimeError, match=f"{NOSET_VISIBLE_DEVICES} is set.*unset it"):
        cuda_ordinal({NOSET_VISIBLE_DEVICES: value, "CUDA_VISIBLE_DEVICES": "0,1"}, ["1"], device_count=2)
    assert cuda_ordinal({NOSET_VISIBLE_DEVICES: "0"}, ["1"], device_count=2) == 1  # "0" = off


def test_an_assignment_the_process_cannot_see_is_refused():
    with pytest.raises(RuntimeError, match="does not list it"):
        cuda_ordinal({"CUDA_VISIBLE_DEVICES": "0"}, ["1"], device_count=1)
    with pytest.raises(RuntimeError, match="torch sees 1 GPU"):
        cuda_ordinal({"CUDA_VISIBLE_DEVICES": "0,1"}, ["1"], device_count=1)


def test_without_cuda_the_device_is_the_cpu():
    if torch.cuda.is_available():
        assert assigned_device().type == "cuda"
    else:
        assert assigned_device() == torch.device("cpu")
