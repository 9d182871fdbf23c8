"""Load a WebShop catalogue from upstream's raw JSON files (or the synthetic generator) and derive
products, prices and goals the way upstream's `load_products` / `get_goals` do.

Raw schemas (upstream file names, looked up in `data_path`):
- items_shuffle.json (else items_shuffle_1000.json): a list of products {asin, name,
  full_description, small_description (list or str), pricing ("$12.99" or "$10.00$20.00"),
  customization_options {name: [{value, image}]}, images, category, query, product_category};
- items_ins_v2.json (else items_ins_v2_1000.json): {asin: {attributes, instruction,
  instruction_attributes}};
- items_human_ins.json: {asin: [{instruction, instruction_attributes, instruction_options}]}.

Derived product keys (upstream's): Title, Description, BulletPoints, pricing (floats), Price (tag),
options ({lowercased name: [value lowercased, '/' -> ' | ']}), Attributes (['DUMMY_ATTR'] when
absent), Rating 'N.A.', Reviews [] (upstream's reviews are not shipped), query lowercased+stripped.
Products whose asin is 'nan' or longer than 10 characters, and repeated asins, are skipped.

Randomness: upstream draws range prices and goal price limits from the unseeded global RNG, then
shuffles the goals with seed 233. Here prices and limits come from `random.Random(seed)` (same
draw order: all prices, then one limit per product/instruction), so runs are reproducible; the
goal shuffle uses seed 233 exactly as upstream. `Catalogue.pinned(meta)` replaces prices and
goals with recorded ones for parity replays.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from envs.webshop.raw import RawCatalogue

GoalMode = Literal["synthetic", "human"]
PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
ATTRIBUTE_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
HUMAN_FILE = "items_human_ins.json"
GOAL_SHUFFLE_SEED = 233
NO_PRICE_LIMIT = 1000000
_PRICE_STEPS = [10.0 * i for i in range(1, 100)]


class CatalogueError(ValueError):
    """A WebShop catalogue file the loader cannot use: names the file or the product, and the problem."""


@contextlib.contextmanager
def _record(what: str) -> Iterator[None]:
    """Turn a lookup into a malformed record (a missing key, a value of the wrong type) into a
    CatalogueError naming the record."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        raise CatalogueError(f"{what}: malformed record ({type(err).__name__}: {err})") from err


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (ValueError, RecursionError) as err:  # JSON and UTF-8 errors are ValueErrors
        raise CatalogueError(f"{path}: not a readable JSON file ({err})") from None


@dataclass
class Catalogue:
    """Products (upstream-derived dicts, file order), their prices, and goals in environment order."""

    products: list[dict[str, Any]]
    prices: dict[str, float]
    goals: list[dict[str, Any]]
    goal_mode: GoalMode
    by_asin: dict[str, dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.by_asin = {p["asin"]: p for p in self.products}
        self._search: Any = None

    @property
    def search(self) -> Any:
        """The BM25 index over this catalogue (built on first use, shared by every session)."""
        if self._search is None:
            from envs.webshop.search import SearchIndex

            self._search = SearchIndex(self.products)
        return self._search

    def pinned(self, meta: dict[str, Any]) -> Catalogue:
        """A copy with recorded `product_prices` and/or `goals` (upstream dicts, env order)."""
        prices = dict(self.prices)
        unknown = set(meta.get("product_prices", {})) - set(self.by_asin)
        if unknown:
            raise ValueError(f"env meta prices name asins missing from the catalogue: {sorted(unknown)[:5]}")
        prices.update({a: float(p) for a, p in meta.get("product_prices", {}).items()})
        goals = [self._complete_goal(i, g) for i, g in enumerate(meta["goals"])] if "goals" in meta else self.goals
        pinned = replace(self, prices=prices, goals=goals)
        pinned._search = self._search
        return pinned

    def _complete_goal(self, index: int, goal: Any) -> dict[str, Any]:
        """A pinned goal with the product fields it lacks (GOAL_PRODUCT_FIELDS) taken from its asin's
        product, as upstream's get_goals derives them; a CatalogueError naming the goal and the field
        when a field cannot be completed (no asin, an asin not in the catalogue, a goal-only field)."""
        where = f"env meta {self.goal_mode} goal {index}"
        if not isinstance(goal, dict):
            raise CatalogueError(f"{where}: expected a goal object, got {type(goal).__name__}")
        goal = dict(goal)
        missing = [k for k in (*GOAL_FIELDS, *GOAL_PRODUCT_FIELDS) if k not in goal]
        if not missing:
            return goal
        label = f"{where} (asin {goal.get('asin')!r})"
        lacking = [k for k in missing if k not in GOAL_PRODUCT_FIELDS]
        if lacking:
            raise CatalogueError(f"{label} lacks {', '.join(repr(k) for k in lacking)}, which the engine needs and "
                                 "only the goal can give; record it in the env meta")
        product = self.by_asin.get(str(goal["asin"]))
        if product is None:
            raise CatalogueError(f"{label} lacks {', '.join(repr(k) for k in missing)} and its asin is not in the "
                                 "catalogue to complete them from; record them in the env meta")
        for key in missing:
            source = "Title" if key == "name" and self.goal_mode == "synthetic" else key
            if source not in product:
                raise CatalogueError(f"{label} lacks {key!r} and product {goal['asin']} has no {source!r} to "
                                     "complete it from; record it in the env meta")
            goal[key] = product[source]
        return goal


GOAL_FIELDS = ("asin", "instruction_text", "attributes", "goal_options", "price_upper")
"""Goal keys the embedded engine reads that only the goal itself holds."""
GOAL_PRODUCT_FIELDS = ("category", "query", "name", "product_category")
"""Goal keys upstream copies from the goal's product (synthetic goals: name = the product's Title);
a pinned goal without them is completed from the catalogue by asin."""


def find_file(data_path: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (data_path / name).is_file():
            return data_path / name
    raise FileNotFoundError(
        f"no {' or '.join(names)} in {data_path}: point env.data_path at a folder with the upstream WebShop "
        "files, or generate one with `python -m deploy env generate-webshop --out DIR`"
    )


def read_raw(data_path: Path) -> RawCatalogue:
    """Read the upstream files from `data_path` (human instructions optional)."""
    if not data_path.is_dir():
        raise FileNotFoundError(f"WebShop data_path {data_path} is not a folder")
    products = _read_json(find_file(data_path, PRODUCT_FILES))
    attributes = _read_json(find_file(data_path, ATTRIBUTE_FILES))
    human_path = data_path / HUMAN_FILE
    human = _read_json(human_path) if human_path.is_file() else {}
    if not isinstance(products, list) or not isinstance(attributes, dict) or not isinstance(human, dict):
        raise CatalogueError(
            f"{data_path}: expected a list of products, a dict of attributes by asin and a dict of human "
            "instructions by asin (upstream WebShop schemas)"
        )
    return RawCatalogue(products, attributes, human)


def parse_pricing(raw: Any, asin: str) -> tuple[list[float], str]:
    """Upstream's price parsing: ('$a' | '$a$b...') -> (floats, price tag)."""
    if not raw:
        return [100.0], "$100.0"
    try:
        values = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in str(raw).split("$")[1:]]
    except InvalidOperation as err:
        raise CatalogueError(
            f"product {asin}: unreadable pricing {raw!r} (expected '$12.99' or '$10$20')"
        ) from err
    if not values:
        raise CatalogueError(f"product {asin}: pricing {raw!r} has no '$' amount")
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def derive_products(raw: RawCatalogue, goal_mode: GoalMode) -> list[dict[str, Any]]:
    """Upstream `load_products`: cleaned product dicts with the derived keys (see module doc)."""
    seen: set[str] = set()
    products = []
    for index, record in enumerate(raw.products):
        asin = record.get("asin") if isinstance(record, dict) else None
        if not isinstance(asin, str):
            raise CatalogueError(f"product #{index}: expected an object with a string 'asin', got {str(record)[:80]}")
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        with _record(f"product {asin}"):
            products.append(_derive_product(record, asin, raw, goal_mode))
    return products


def _derive_product(record: dict[str, Any], asin: str, raw: RawCatalogue, goal_mode: GoalMode) -> dict[str, Any]:
    """One record of `derive_products`."""
    product = dict(record)
    small = record.get("small_description", [])
    pricing, price_tag = parse_pricing(record.get("pricing"), asin)
    options: dict[str, list[str]] = {}
    for name, contents in (record.get("customization_options") or {}).items():
        if contents is None:
            continue
        options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    attrs = raw.attributes.get(asin, {})
    product.update(
        Title=record["name"],
        Description=record["full_description"],
        BulletPoints=small if isinstance(small, list) else [small],
        Reviews=[],
        Rating="N.A.",
        pricing=pricing,
        Price=price_tag,
        options=options,
        Attributes=attrs.get("attributes", ["DUMMY_ATTR"]),
        query=record["query"].lower().strip(),
    )
    if goal_mode == "human":
        if asin in raw.human_instructions:
            product["instructions"] = raw.human_instructions[asin]
    else:
        product["instruction_text"] = attrs.get("instruction")
        product["instruction_attributes"] = attrs.get("instruction_attributes")
    return product


def product_prices(products: list[dict[str, Any]], rng: random.Random) -> dict[str, float]:
    """Fixed prices stay; a range price is drawn uniformly from it (upstream's rule)."""
    prices = {}
    for p in products:
        pricing = p["pricing"]
        prices[p["asin"]] = (
            100.0 if not pricing else pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
        )
    return prices


def _price_limit(price: float, rng: random.Random) -> tuple[float, str]:
    steps = [s for s in _PRICE_STEPS if s > price][:4]
    if len(steps) < 2:
        return NO_PRICE_LIMIT, ""
    _, upper = sorted(rng.sample(steps, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def synthetic_goals(
    products: list[dict[str, Any]], prices: dict[str, float], rng: random.Random
) -> list[dict]:
    """One goal per combination of a product's option values (option names sorted)."""
    goals = []
    for p in products:
        if p.get("instruction_text") is None:
            continue
        attributes = p["instruction_attributes"]
        if not attributes:
            raise CatalogueError(f"product {p['asin']}: synthetic instruction without instruction_attributes")
        upper, price_text = _price_limit(prices[p["asin"]], rng)
        names = sorted(p["options"])
        for combination in itertools.product(*(p["options"][n] for n in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                {
                    "asin": p["asin"],
                    "category": p["category"],
                    "query": p["query"],
                    "name": p["Title"],
                    "product_category": p["product_category"],
                    "instruction_text": f"{p['instruction_text']}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": upper,
                    "goal_options": goal_options,
                }
            )
    return goals


def human_goals(products: list[dict[str, Any]], prices: dict[str, float], rng: random.Random) -> list[dict]:
    """One goal per crowd-sourced instruction with at least one attribute."""
    goals = []
    for p in products:
        for ins in p.get("instructions", []):
            if not ins["instruction_attributes"]:
                continue
            upper, price_text = _price_limit(prices[p["asin"]], rng)
            goals.append(
                {
                    "asin": p["asin"],
                    "category": p["category"],
                    "query": p["query"],
                    "name": p["name"],
                    "product_category": p["product_category"],
                    "instruction_text": ins["instruction"].strip(".") + price_text,
                    "attributes": ins["instruction_attributes"],
                    "price_upper": upper,
                    "goal_options": ins["instruction_options"],
                }
            )
    return goals


def build_catalogue(raw: RawCatalogue, goal_mode: GoalMode, seed: int) -> Catalogue:
    """Derive products, draw prices and limits from `seed`, shuffle goals as upstream."""
    products = derive_products(raw, goal_mode)
    rng = random.Random(seed)
    prices = product_prices(products, rng)
    make = human_goals if goal_mode == "human" else synthetic_goals
    goals = []
    for p in products:  # product by product (the same draws in the same order) to name a bad record
        with _record(f"product {p['asin']}"):
            goals += make([p], prices, rng)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalogue(products=products, prices=prices, goals=goals, goal_mode=goal_mode)


@functools.lru_cache(maxsize=8)
def load_catalogue(data_path: str | None, goal_mode: GoalMode, num_products: int, seed: int) -> Catalogue:
    """The catalogue for an EnvConfig (cached per process: every env of a pool shares it).

    data_path None = the synthetic catalogue of `num_products` products generated from `seed`.
    """
    if data_path is None:
        from envs.webshop.generate import generate_raw

        raw = generate_raw(num_products=num_products, seed=seed)
    else:
        raw = read_raw(Path(data_path).expanduser())
    return build_catalogue(raw, goal_mode, seed)


def catalogue_for(cfg: Any, goal_mode: GoalMode | None = None) -> Catalogue:
    """`load_catalogue` for an EnvConfig (`goal_mode` overrides cfg.webshop_goal_mode)."""
    return load_catalogue(
        cfg.data_path,
        goal_mode or cfg.webshop_goal_mode,
        cfg.webshop_num_products,
        cfg.webshop_catalogue_seed,
    )
