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
    with StepProgress(10, 3, enabled=True, console=console) as progress:
        progress.advance(RECORD)
        progress.advance(RECORD)
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["step 4/10", "step 5/10"]
    assert all(step_summary(RECORD) in line and line.endswith("s)") for line in lines)


def test_a_rewind_continues_the_count_from_the_restored_step():
    console, out = _console(terminal=False)
    with StepProgress(4, 0, enabled=True, console=console) as progress:
        progress.advance(RECORD)
        progress.advance(RECORD)
        progress.completed(1)  # a learner restart restored step 1
        progress.advance(RECORD)
    assert [line.split("  ")[0] for line in out.getvalue().splitlines()] == ["step 1/4", "step 2/4", "step 2/4"]


def test_disabled_progress_prints_nothing():
    for terminal in (False, True):
        console, out = _console(terminal)
        with StepProgress(2, 0, enabled=False, console=console) as progress:
            progress.advance(RECORD)
        assert out.getvalue() == ""


def test_a_terminal_gets_the_live_bar_not_lines():
    console, out = _console(terminal=True)
    with StepProgress(2, 0, enabled=True, console=console) as progress:
        assert progress.live
        progress.advance(RECORD)
    text = out.getvalue()
    assert "train" in text and "1/2" in text and "step 1/2" not in text
