"""`env.options` of the ScienceWorld environment (validated; an unknown key names the known ones)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ScienceWorldOptions(BaseModel):
    """What a config may set under `env.options` for ScienceWorld."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    simplifications: str = "easy"
    """ScienceWorld's simplification string (comma-separated, e.g. "teleportAction,openDoors"; "easy" =
    all of them, the setting most agent papers use; "" = none)."""
    task_names: tuple[str, ...] | None = None
    """The task names to draw tasks from (None: all 30)."""
    max_admissible: int = Field(default=0, ge=0)
    """Show at most this many valid actions (sorted) per turn; 0 = all of them. The valid-action
    list often runs to hundreds, more than a small model's prompt holds."""
    gold_path: bool = False
    """Have ScienceWorld generate each task's gold action sequence on load (the gold replay)."""
