"""The hypothesis figures `experiment report` reads from a grid's copied analyses
(deploy/experiment/analysis_figures.py), on hand-made analysis files."""

import json
from pathlib import Path

import pytest

from deploy.experiment.analysis_figures import (
    analysis_figures,
    figures_markdown,
    last_quarter_top_op,
    spearman_ci,
)


def _write(d: Path, run: str, name: str, data: dict) -> None:
    (d / run).mkdir(parents=True, exist_ok=True)
    (d / run / name).write_text(json.dumps(data))


def _series(no_edit, add, proposals):
    return {"steps": list(range(1, len(no_edit) + 1)), "proposals": proposals,
            "ops": {"no_edit": no_edit, "add": add, "update": [0.0] * len(no_edit), "unparsed": [0.0] * len(no_edit)}}


def test_last_quarter_weights_steps_by_proposals_and_skips_empty_steps():
    # 8 steps: the last quarter is steps 7 and 8 (> 0.75 x 8 = 6); step 8 had no parsed proposal
    s = _series([0, 0, 0, 0, 0, 0, 0.5, 0.0], [1, 1, 1, 1, 1, 1, 0.5, 0.0], [8, 8, 8, 8, 8, 8, 4, 8])
    top = last_quarter_top_op(s)
    assert top["proposals"] == 4 and top["share"] == pytest.approx(0.5)
    s = _series([0, 0, 0, 0, 0, 0, 1.0, 0.25], [1, 1, 1, 1, 1, 1, 0.0, 0.75], [8, 8, 8, 8, 8, 8, 8, 4])
    top = last_quarter_top_op(s)  # no_edit 8 + 1 = 9 of 12, add 3 of 12
    assert (top["op"], top["proposals"]) == ("no_edit", 12) and top["share"] == pytest.approx(9 / 12)
    assert last_quarter_top_op(_series([0.0] * 4, [0.0] * 4, [0] * 4))["op"] is None


def test_figures_from_copied_analyses(tmp_path):
    assert analysis_figures(tmp_path / "none") == {} and figures_markdown({}) == ""
    _write(tmp_path, "smrc_sd_seed0", "replay_audit.json",
           {"matchers": {"structured": {"replayed": 10, "replay_success": 10}, "text": {"replayed": 9}}})
    _write(tmp_path, "smrc_sd_seed1", "replay_audit.json", {"matchers": {"structured": {"replayed": 5,
                                                                                        "replay_success": 4}}})
    _write(tmp_path, "uniskill_seed0", "skills_growth.json", {"series": _series([0, 1, 1, 1], [1, 0, 0, 0], [8] * 4)})
    gains = [{"r_align": r, "gain": g} for r, g in [(0.1, 0.0), (0.2, 0.25), (0.3, 0.5), (-0.1, -0.25)]]
    _write(tmp_path, "uniskill_seed0", "ralign_vs_rollout.json", {"gains": gains[:2], "skipped_steps": {"9": "x"},
                                                                  "stats": {"n": 2, "spearman_rho": 1.0}})
    _write(tmp_path, "uniskill_seed1", "ralign_vs_rollout.json", {"gains": gains[2:],
                                                                  "stats": {"n": 2, "spearman_rho": 1.0}})
    f = analysis_figures(tmp_path)
    assert (f["replay_audit"]["replayed"], f["replay_audit"]["replay_success"]) == (15, 14)
    assert f["replay_audit"]["rate"] == pytest.approx(14 / 15)
    assert f["op_collapse"]["runs"]["uniskill_seed0"] == {"op": "no_edit", "share": 1.0, "proposals": 8}
    pooled = f["ralign_vs_rollout"]["pooled"]
    assert pooled["n"] == 4 and pooled["spearman_rho"] == pytest.approx(1.0)  # ranks agree exactly
    assert f["ralign_vs_rollout"]["runs"]["uniskill_seed0"]["skipped_steps"] == {"9": "x"}
    text = figures_markdown(f)
    assert "14/15 matched turns replay" in text and "uniskill_seed0 no_edit 1.00 (n=8)" in text
    assert "pooled +1.000" in text


def test_spearman_ci_brackets_the_estimate_and_needs_three_pairs():
    assert spearman_ci([0.1, 0.2], [1.0, 2.0]) == (None, None)
    x = [0.1 * i for i in range(20)]
    y = [v + (0.3 if i % 3 == 0 else 0.0) for i, v in enumerate(x)]
    lo, hi = spearman_ci(x, y)
    assert lo is not None and lo > 0.5 and hi <= 1.0
