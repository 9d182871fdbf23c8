"""Shared test setup. Tests are not a package (import-mode=importlib); the repo root is on sys.path."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


ALFWORLD_FIXTURE_GAMES = {"train": 30, "valid_seen": 6, "valid_unseen": 6}
"""Games per split in the `alfworld_data_dir` fixture (train: 6 task types x 5, round-robin)."""


def _alfworld_fixture_key() -> str:
    import hashlib
    from importlib.metadata import version

    source = (ROOT / "envs" / "alfworld_real" / "generator.py").read_bytes()
    parts = [source, version("alfworld").encode(), version("textworld").encode()]
    return hashlib.sha256(b"|".join([*parts, repr(ALFWORLD_FIXTURE_GAMES).encode()])).hexdigest()[:16]


import pytest


@pytest.fixture(scope="session")
def alfworld_data_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ALFWorld data root (json_2.1.1/{train,valid_seen,valid_unseen}) of generated games, each
    verified solvable by the real handcoded expert. Generated once (~40 s on one core) into pytest's
    cache, keyed by the generator source and the alfworld/textworld versions, and reused by later
    sessions; treat it as read-only. Built in a private folder and renamed into place, so sessions
    running at the same time never see a half-written root."""
    import os
    import shutil

    from envs.alfworld_real.generator import generate

    name = f"alfworld_games_{_alfworld_fixture_key()}"
    cache = getattr(request.config, "cache", None)
    parent = cache.mkdir("alfworld") if cache is not None else tmp_path_factory.mktemp("alfworld")
    root = parent / name
    if (root / "COMPLETE").exists():
        return root
    staging = parent / f"{name}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    for split, count in ALFWORLD_FIXTURE_GAMES.items():
        generate(staging, num_games=count, seed=0, split=split)
    (staging / "COMPLETE").write_text("ok\n")
    try:
        os.rename(staging, root)
    except OSError:  # another session finished first (or left a broken root): keep a complete one
        if not (root / "COMPLETE").exists():
            shutil.rmtree(root, ignore_errors=True)
            os.rename(staging, root)
        else:
            shutil.rmtree(staging, ignore_errors=True)
    return root



# README's runs (tests/readme/session.py), registered here once for the whole suite: a session
# fixture imported into two test modules would be two fixtures, and README's blocks would run twice.
from tests.readme.session import readme_demo, readme_first_run, readme_session  # noqa: F401
