"""bench/suite_time.py: per-area seconds of a JUnit XML report."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from suite_time import area, summarise

JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="tests.deploy.test_faults" name="a" time="60.5"/>
<testcase classname="tests.deploy.test_config" name="b" time="0.5"><failure message="x"/></testcase>
<testcase classname="tests.envs.alfworld_real.test_env" name="c" time="2.0"><skipped/></testcase>
<testcase classname="tests.test_layout" name="d" time="1.0"/>
<testcase classname="tests.learner.test_algos.TestGroup" name="e" time="3.0"/>
</testsuite></testsuites>"""


def test_areas_are_the_folders_under_tests():
    assert area("tests.deploy.test_faults") == "tests/deploy"
    assert area("tests.envs.alfworld_real.test_env") == "tests/envs/alfworld_real"
    assert area("tests.test_layout") == "tests"
    assert area("tests.learner.test_algos.TestGroup") == "tests/learner"


def test_summary_sums_seconds_and_counts_per_area(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    table = summarise(junit)
    assert list(table) == ["tests/deploy", "tests/learner", "tests/envs/alfworld_real", "tests"]  # by seconds
    assert table["tests/deploy"] == {"tests": 2, "seconds": 61.0, "failed": 1, "skipped": 0}
    assert table["tests/envs/alfworld_real"]["skipped"] == 1


def test_a_missing_report_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_time.py"), str(tmp_path / "none.xml")],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--junitxml" in res.stderr
