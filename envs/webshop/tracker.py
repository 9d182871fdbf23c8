"""WebShop state signatures from the (action, observation, admissible actions) stream
(docs/environments.md 5.2).

Invariants:
- Pure and deterministic: turn t's signature depends only on the instruction, the observations
  0..t, the actions 0..t-1 and (when given) the admissible actions shown with each observation,
  so the real env, the embedded `envs.webshop` env and archived logs give the same signatures.
- Turn t's signature describes the page the agent sees *before* choosing action t; the reset
  observation is turn 0 (`observe(None, obs)`).
- The page is read from the raw text-mode observation: "Thank you for shopping" -> done; a
  "Page N (Total results: M)" part -> results; a last part "Buy Now" -> item; "< Prev" without
  those -> item_sub:<the clicked tab> (description/features/reviews/attributes); the first-page
  layout ("WebShop [SEP] Instruction: ... [SEP] Search", or "Search" as the last part) -> search.
- Selected options are not shown in text mode, so they are tracked from actions: a click on an
  option value of the item page sets options[<its header>] = value. Headers and values are told
  apart by the admissible actions (values are clickable, headers are not); without them every
  value is filed under the section's first header (one option group: exact for single-option
  items, a documented approximation otherwise).
- A product click starts a fresh selection (product = that asin, options = {}); landing on a search
  or results page clears product and options (Back to Search, a new search or "< Prev" back to the
  results: upstream resets the options on the next product click anyway).
- An action that does not change the page (an invalid click, a search on a non-search page that
  the env ignores) changes nothing but what the new observation shows.

Exact signature fields (ordered, under task_id): page, results_page, product, options. Departure
from 5.2's (task_id, page, product, options): the results page number is added, so that a matched
results page lists the same products as the reference's (the same reason the ALFWorld tracker
keeps opened/placed in its exact key).
Abstract signature (task_id "*"): page, stage, option_progress bucket, price_ok, results_page bucket.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from envs.types import StateSignature

ENV_NAME = "webshop"
SEP = " [SEP] "
Stage = Literal["start", "searched", "viewing_item", "options_set", "bought"]
SUB_PAGES = ("description", "features", "reviews", "attributes")

_RESULTS = re.compile(r"^Page (\d+) \(Total results: (\d+)\)$")
_PRICE = re.compile(r"^Price: \$([\d,]+(?:\.\d+)?)")
_ASIN = re.compile(r"^[a-z0-9]{10}$")
_ACTION = re.compile(r"^(search|click)\[(.*)\]$", re.DOTALL)
_GOAL_PRICE = re.compile(r"price lower than ([\d,]+(?:\.\d+)?) dollars")
_GOAL_OPTIONS = re.compile(r"\bwith ((?:[^,:]+: [^,]+)(?:, and [^,:]+: [^,]+)*)")
_DONE = "Thank you for shopping with us!"


def parse_action(action: str) -> tuple[str, str] | None:
    """("search" | "click", argument) of a WebShop action (lowercased), None if malformed."""
    m = _ACTION.match(action.strip().lower())
    return (m.group(1), m.group(2).strip()) if m else None


def goal_price_limit(instruction: str) -> float | None:
    """P of "price lower than P dollars" in the instruction, None when absent."""
    m = _GOAL_PRICE.search(instruction.lower())
    return float(m.group(1).replace(",", "")) if m else None


def goal_options(instruction: str) -> dict[str, str]:
    """Goal options of a synthetic instruction ("... with color: navy blue, and size: large, and
    price lower than ..."); {} for human instructions, which state none in this form."""
    m = _GOAL_OPTIONS.search(instruction.lower())
    if not m:
        return {}
    out: dict[str, str] = {}
    for item in m.group(1).split(", and "):
        name, _, value = item.partition(": ")
        if name.strip() and value.strip() and not name.strip().startswith("price"):
            out[name.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class Page:
    """What one raw observation shows: the page kind and, for item pages, the product's option
    section (header -> values), title and price."""

    kind: str  # search | results | item | item_sub | done | unknown
    results_page: int = 0
    option_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    price: float | None = None


def read_page(observation: str, clickables: frozenset[str] | None = None) -> Page:
    """Classify a raw text-mode observation (see the module docstring). `clickables` (lowercased
    click arguments) separate option values from headers on item pages."""
    parts = observation.split(SEP)
    if _DONE in parts[0]:
        return Page("done")
    for part in parts:
        if m := _RESULTS.match(part):
            return Page("results", results_page=int(m.group(1)))
    if parts[-1] == "Buy Now":
        return _item_page(parts, clickables)
    if "< Prev" in parts:
        return Page("item_sub")
    if parts[0] == "WebShop" or parts[-1] == "Search":
        return Page("search")
    return Page("unknown")


def _item_page(parts: list[str], clickables: frozenset[str] | None) -> Page:
    price_at = next((i for i, p in enumerate(parts) if _PRICE.match(p)), None)
    prev_at = parts.index("< Prev") if "< Prev" in parts else None
    price = None
    if price_at is not None and (m := _PRICE.match(parts[price_at])):
        price = float(m.group(1).replace(",", ""))
    if price_at is None or prev_at is None or price_at - 1 <= prev_at + 1:
        return Page("item", price=price)
    section = parts[prev_at + 1 : price_at - 1]  # the part before the price is the title
    groups: list[tuple[str, list[str]]] = []
    for i, part in enumerate(section):
        is_value = part.lower() in clickables if clickables is not None else i > 0
        if is_value and groups:
            groups[-1][1].append(part.lower())
        elif not is_value:
            groups.append((part.lower(), []))
    return Page("item", option_groups=tuple((h, tuple(v)) for h, v in groups if v), price=price)


@dataclass
class _State:
    page: Page = field(default_factory=lambda: Page("unknown"))
    sub_page: str = ""
    results_page: int = 0
    n_searches: int = 0
    product: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    price: float | None = None


class WebShopTracker:
    """Per-episode tracker. Call `observe(None, reset_obs)` first, then `observe(a_t, obs_{t+1})`.

    `instruction` may be "" to take it from the reset observation ("Instruction: [SEP] <text>").
    """

    def __init__(self, task_id: str, instruction: str = "") -> None:
        self.task_id = task_id
        self.instruction = instruction
        self._s = _State()
        self.turn = -1

    def observe(
        self, action: str | None, observation: str, admissible: Sequence[str] | None = None
    ) -> StateSignature:
        """Update the state with one (action, resulting observation) and return the exact signature."""
        clickables = None
        if admissible is not None:
            clicks = (parse_action(a) for a in admissible)
            clickables = frozenset(c[1] for c in clicks if c is not None and c[0] == "click")
        if action is None:
            self._s, self.turn = _State(), -1
            if not self.instruction:
                parts = observation.split(SEP)
                if "Instruction:" in parts[:-1]:
                    self.instruction = parts[parts.index("Instruction:") + 1]
        self.turn += 1
        self._update(action, read_page(observation, clickables))
        return self.signature()

    def _update(self, action: str | None, page: Page) -> None:
        s, before = self._s, self._s.page
        act = parse_action(action) if action else None
        if page.kind == "results" and act and act[0] == "search":
            s.n_searches += 1
        if page.kind in ("search", "results"):
            s.product, s.options, s.groups, s.price = None, {}, (), None
            s.results_page = page.results_page
        elif page.kind == "item":
            if act and act[0] == "click" and _ASIN.match(act[1]) and before.kind == "results":
                s.product, s.options = act[1], {}
            if before.kind != "item":  # an option click keeps the page (and its sections)
                s.groups, s.price = page.option_groups, page.price
            if act and act[0] == "click" and before.kind == "item":
                for header, values in s.groups:
                    if act[1] in values:
                        s.options[header] = act[1]
                        break
        elif page.kind == "item_sub" and act and act[0] == "click" and act[1] in SUB_PAGES:
            s.sub_page = act[1]
        s.page = page

    # ---- derived fields -------------------------------------------------------------------
    def page_name(self) -> str:
        kind = self._s.page.kind
        return f"item_sub:{self._s.sub_page or 'unknown'}" if kind == "item_sub" else kind

    def option_progress(self) -> tuple[int, int]:
        """(k, K): K = goal options in the instruction, or the item's option groups when the
        instruction states none; k = those satisfied by the selection (values compared after
        lowercasing and whitespace collapsing, either containing the other)."""
        goal = goal_options(self.instruction)
        if goal:
            chosen = [_norm(v) for v in self._s.options.values()]
            hit = sum(any(_norm(v) in c or c in _norm(v) for c in chosen if c) for v in goal.values())
            return hit, len(goal)
        return len(self._s.options), len(self._s.groups)

    def price_ok(self) -> str:
        limit, price = goal_price_limit(self.instruction), self._s.price
        if limit is None or price is None or self._s.product is None:
            return "unknown"
        return str(price <= limit).lower()  # upstream r_price: price <= price_upper

    def stage(self) -> Stage:
        s = self._s
        if s.page.kind == "done":
            return "bought"
        if s.product is not None and s.page.kind in ("item", "item_sub"):
            k, total = self.option_progress()
            return "options_set" if total > 0 and k >= total else "viewing_item"
        return "searched" if s.n_searches > 0 else "start"

    def options_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self._s.options.items()))

    def fields(self) -> dict[str, str]:
        """All tracked fields (for logging and teacher-context summaries)."""
        k, total = self.option_progress()
        s = self._s
        return {
            "stage": self.stage(),
            "page": self.page_name(),
            "results_page": str(s.results_page),
            "n_searches": str(min(s.n_searches, 2)) + ("+" if s.n_searches >= 2 else ""),
            "product": s.product or "none",
            "options": self.options_text(),
            "option_progress": f"{k}/{total}",
            "price_ok": self.price_ok(),
        }

    def signature(self) -> StateSignature:
        """Exact signature: (page, results_page, product, options) under task_id."""
        f = self.fields()
        keys = ("page", "results_page", "product", "options")
        return StateSignature(env=ENV_NAME, task_id=self.task_id, fields=tuple((k, f[k]) for k in keys))

    def abstract_signature(self) -> StateSignature:
        """Cross-task key: (page, stage, option_progress bucket, price_ok, results_page bucket)."""
        k, total = self.option_progress()
        progress = "none" if total == 0 else ("all" if k >= total else ("0" if k == 0 else "partial"))
        rp = self._s.results_page
        fields = (
            ("page", self.page_name()),
            ("stage", self.stage()),
            ("option_progress", progress),
            ("price_ok", self.price_ok()),
            ("results_page", "none" if rp == 0 else ("3+" if rp >= 3 else str(rp))),
        )
        return StateSignature(env=ENV_NAME, task_id="*", fields=fields)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def signatures_for_episode(
    task_id: str,
    task_type: str,
    goal_text: str,
    observations: Sequence[str],
    actions: Sequence[str],
    *,
    admissible: Sequence[Sequence[str]] | None = None,
    abstract: bool = False,
) -> list[StateSignature]:
    """One signature per turn of an archived episode (the ALFWorld tracker's interface).

    `observations[0]` is the reset observation and `observations[t]` follows `actions[t-1]`;
    `admissible[t]`, when given, lists the actions shown with `observations[t]` (it may be one
    shorter than `observations`: the final observation's list is then unknown). `task_type` is
    accepted for interface parity and unused (the page, not the category, drives the state).
    """
    del task_type
    if len(observations) not in (len(actions), len(actions) + 1):
        raise ValueError(f"{len(observations)} observations for {len(actions)} actions")
    if admissible is not None and len(admissible) not in (len(observations), len(observations) - 1):
        raise ValueError(f"{len(admissible)} admissible-action lists for {len(observations)} observations")
    tracker = WebShopTracker(task_id, goal_text)
    out: list[StateSignature] = []
    for t, obs in enumerate(observations):
        shown = admissible[t] if admissible is not None and t < len(admissible) else None
        sig = tracker.observe(None if t == 0 else actions[t - 1], obs, shown)
        out.append(tracker.abstract_signature() if abstract else sig)
    return out
