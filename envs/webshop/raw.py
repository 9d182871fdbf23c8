"""The contents of upstream WebShop's three raw files, as read from disk (`catalogue.read_raw`) or
made by the synthetic generator (`generate.generate_raw`); `catalogue` derives products and goals
from them. Schemas: see `envs.webshop.catalogue`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RawCatalogue:
    """The three upstream files' contents."""

    products: list[dict[str, Any]]
    attributes: dict[str, dict[str, Any]]
    human_instructions: dict[str, list[dict[str, Any]]]
