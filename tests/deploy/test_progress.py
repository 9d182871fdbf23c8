"""The training loop's console progress: one line per step where no terminal shows a live bar."""

import io

from rich.console import Console

from deploy.progress import StepProgress, step_summary

RECORD = {"success_rate": 0.25, "loss/total": -0.0123, "response_len_mean": 7.5, "time/rollout_s": 3.2}


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200), out


def test_step_summary_names_success_loss_length_and_rollout_time():
    assert step_summary(RECORD) == "success 0.25  loss -0.0123  len 7.5  3s rollout"
    assert step_summary({}) == "success 0.00  loss +0.0000  len 0.0  0s rollout"


def test_without_a_terminal_each_step_is_one_line_counting_from_the_resumed_step():
    console, out = _console(terminal=False)
    with StepProgress("train", 10, 3, enabled=True, console=console) as progress:
        progress.advance(step_summary(RECORD))
        progress.advance(step_summary(RECORD))
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["train 4/10", "train 5/10"]
    assert all(step_summary(RECORD) in line and line.endswith("s)") for line in lines)


def test_a_rewind_continues_the_count_from_the_restored_step():
    console, out = _console(terminal=False)
    with StepProgress("train", 4, 0, enabled=True, console=console) as progress:
        progress.advance(step_summary(RECORD))
        progress.advance(step_summary(RECORD))
        progress.completed(1)  # a learner restart restored step 1
        progress.advance(step_summary(RECORD))
    assert [line.split("  ")[0] for line in out.getvalue().splitlines()] == ["train 1/4", "train 2/4", "train 2/4"]


def test_disabled_progress_prints_nothing():
    for terminal in (False, True):
        console, out = _console(terminal)
        with StepProgress("train", 2, 0, enabled=False, console=console) as progress:
            progress.advance(step_summary(RECORD))
        assert out.getvalue() == ""


def test_a_terminal_gets_the_live_bar_not_lines():
    console, out = _console(terminal=True)
    with StepProgress("train", 2, 0, enabled=True, console=console) as progress:
        assert progress.live
        progress.advance(step_summary(RECORD))
    text = out.getvalue()
    assert "train" in text and "1/2" in text and "train 1/2 " not in text


def test_every_n_steps_and_the_last_without_a_terminal():
    console, out = _console(terminal=False)
    with StepProgress("sft", 7, every=3, console=console) as progress:
        for _ in range(7):
            progress.advance("loss 1.0")
    assert [line.split("  ")[0] for line in out.getvalue().splitlines()] == ["sft 3/7", "sft 6/7", "sft 7/7"]
