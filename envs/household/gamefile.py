"""Loading real ALFWorld game folders (game.tw-pddl + traj_data.json) into a fact model the
embedded simulator can play (`envs.household.gamefile_engine`).

What is read, and how the real engine reads it (alfworld 0.4.2 + TextWorld's PddlEnv, restated):
- `game.tw-pddl` is JSON: `pddl_domain` (must be alfworld's alfred.pddl: the engine implements that
  domain's actions, not arbitrary PDDL), `grammar` (alfworld's alfred.twl2 with `UNKNOWN GOAL`
  replaced by the goal sentence; anything else changed is refused), `pddl_problem` (the same text
  as initial_state.pddl), `solvable`;
- names are case-insensitive (Fast Downward lowercases them); the problem's objects, its initial
  atoms and its goal formula are parsed here; numeric fluents (`(= (distance ..) n)`) are ignored as
  the engine ignores them;
- display names follow alfworld's Demangler: the class is the id's text before the first `_bar_`
  (plus `basin` when the id contains `basin`), and within a class the ids are numbered by sorted
  id, the first id getting the highest number; only ids that occur in some initial atom count;
- `traj_data.json` gives the task type and `pddl_params` (the handcoded expert's goal).

Unsupported features fail here with a `GameFileError` naming the file and the feature.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"

Atom = tuple[str, ...]
"""A ground atom: (predicate, arg, ...), all lowercase."""


class GameFileError(ValueError):
    """A game folder the simulator cannot load: names the file and the problem."""


# ---------------------------------------------------------------- goal formulas


@dataclass(frozen=True)
class Lit:
    """An atom over variables (`?x`) and constants; `=` compares its two arguments."""

    pred: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Not:
    body: Formula


@dataclass(frozen=True)
class And:
    parts: tuple[Formula, ...]


@dataclass(frozen=True)
class Or:
    parts: tuple[Formula, ...]


@dataclass(frozen=True)
class Exists:
    variables: tuple[tuple[str, str], ...]  # (name, pddl type)
    body: Formula


@dataclass(frozen=True)
class Forall:
    variables: tuple[tuple[str, str], ...]
    body: Formula


Formula = Lit | Not | And | Or | Exists | Forall


# ---------------------------------------------------------------- the loaded game


@dataclass(frozen=True)
class GameFile:
    """One game as the simulator plays it.

    `objects` maps each (lowercase) id to its PDDL type; `names` maps the ids that have a display
    name (the Demangler's "<class> <n>") to it; `init` holds every initial atom; `goal_text` is the
    sentence after "Your task is to: " without the final period the grammar adds.
    """

    path: Path
    task_type: str
    pddl_params: dict[str, str]
    goal_text: str
    objects: dict[str, str]
    names: dict[str, str]
    init: frozenset[Atom]
    goal: Formula
    traj: dict = field(default_factory=dict, compare=False, repr=False)

    def of_type(self, pddl_type: str) -> list[str]:
        return sorted(o for o, t in self.objects.items() if t == pddl_type)


def load_game(game_dir: Path | str) -> GameFile:
    """Parse a trial folder (or its game.tw-pddl path) into a `GameFile`."""
    path = Path(game_dir)
    if path.is_file():
        path = path.parent
    game_path, traj_path = path / GAME_FILE, path / TRAJ_FILE
    for needed in (game_path, traj_path):
        if not needed.is_file():
            raise GameFileError(
                f"{needed} does not exist: an ALFWorld trial folder needs {GAME_FILE} and {TRAJ_FILE}"
            )
    try:
        game = json.loads(game_path.read_text())
        traj = json.loads(traj_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise GameFileError(f"cannot read {path}: {exc}") from exc
    for file, content in ((game_path, game), (traj_path, traj)):
        if not isinstance(content, dict):
            raise GameFileError(f"{file} holds a JSON {type(content).__name__}, not an object")
    for key in ("pddl_domain", "grammar", "pddl_problem"):
        if not isinstance(game.get(key), str):
            raise GameFileError(f"{game_path} has no {key!r} text; is it an alfworld 0.4 game.tw-pddl?")
    if _squash(game["pddl_domain"]) != _squash(_shipped("ALFRED_PDDL_PATH")):
        raise GameFileError(
            f"{game_path}: its pddl_domain differs from alfworld's alfred.pddl; the embedded simulator "
            "implements exactly that domain (use backend 'alfworld' for other domains)"
        )
    goal_text = _goal_text(game["grammar"], game_path)
    objects, init, goal = parse_problem(game["pddl_problem"], source=str(game_path), predicates=domain_predicates())
    task_type = traj.get("task_type")
    if not isinstance(task_type, str):
        raise GameFileError(f"{traj_path} has no task_type")
    raw_params = traj.get("pddl_params") or {}
    if not isinstance(raw_params, dict):
        raise GameFileError(f"{traj_path}: pddl_params is a {type(raw_params).__name__}, not an object")
    params = {k: str(v) for k, v in raw_params.items()}
    return GameFile(
        path=path,
        task_type=task_type,
        pddl_params=params,
        goal_text=goal_text,
        objects=objects,
        names=demangled_names(init),
        init=init,
        goal=goal,
        traj=traj,
    )


@cache
def _shipped(attr: str) -> str:
    import alfworld.info

    return Path(getattr(alfworld.info, attr)).read_text()


@cache
def domain_predicates() -> dict[str, int]:
    """The arity of every predicate alfred.pddl declares."""
    tree = parse_sexpr(_shipped("ALFRED_PDDL_PATH"), source="alfred.pddl")
    sections = [p for p in tree[1:] if isinstance(p, list) and p and p[0] == ":predicates"]
    return {
        p[0]: len(_typed_list(p[1:], "alfred.pddl"))
        for section in sections
        for p in section[1:]
        if isinstance(p, list) and p and isinstance(p[0], str)
    }


def _squash(text: str) -> str:
    return " ".join(text.split())


def _goal_text(grammar: str, source: Path) -> str:
    """The goal sentence add_task_to_grammar put in place of UNKNOWN GOAL (grammar otherwise intact)."""
    template = _shipped("ALFRED_TWL2_PATH")
    head, _, tail = template.partition("UNKNOWN GOAL")
    if not (grammar.startswith(head) and grammar.endswith(tail) and len(grammar) >= len(head) + len(tail)):
        raise GameFileError(
            f"{source}: its grammar is not alfworld's alfred.twl2 with the goal filled in; the embedded "
            "simulator reproduces exactly that grammar's texts"
        )
    raw = grammar[len(head) : len(grammar) - len(tail)]
    try:
        text = json.loads(f'"{raw}"')  # the goal sits inside a JSON string of the grammar
    except json.JSONDecodeError:
        text = raw
    if any(ch in text for ch in "#[]{}"):
        raise GameFileError(
            f"{source}: goal sentence {text!r} holds grammar symbols (#, [], {{}}), unsupported"
        )
    return text


# ---------------------------------------------------------------- PDDL problem parsing

SExpr = str | list["SExpr"]


def _tokens(text: str) -> Iterator[str]:
    text = re.sub(r";[^\n]*", " ", text)
    yield from re.findall(r"\(|\)|[^\s()]+", text)


def parse_sexpr(text: str, *, source: str = "<pddl>") -> SExpr:
    stack: list[list[SExpr]] = [[]]
    for tok in _tokens(text):
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise GameFileError(f"{source}: unbalanced ')' in the PDDL problem")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok.lower())
    if len(stack) != 1 or len(stack[0]) != 1:
        raise GameFileError(f"{source}: the PDDL problem is not one balanced (define ...) expression")
    return stack[0][0]


def parse_problem(
    text: str, *, source: str = "<pddl>", predicates: dict[str, int] | None = None
) -> tuple[dict[str, str], frozenset[Atom], Formula]:
    """(objects id -> type, initial atoms, goal formula) of a `(define (problem ..) ..)` text.
    `predicates` (name -> arity, e.g. `domain_predicates()`): atoms of a declared predicate with
    another number of arguments are refused."""
    tree = parse_sexpr(text, source=source)
    if not (isinstance(tree, list) and tree and tree[0] == "define"):
        raise GameFileError(f"{source}: the PDDL problem must start with (define ...)")
    sections: dict[str, list[SExpr]] = {}
    for part in tree[1:]:
        if isinstance(part, list) and part and isinstance(part[0], str):
            sections[part[0]] = part[1:]
    if sections.get(":domain") != ["alfred"]:
        raise GameFileError(f"{source}: the problem's domain must be 'alfred', got {sections.get(':domain')}")
    for needed in (":objects", ":init", ":goal"):
        if needed not in sections:
            raise GameFileError(f"{source}: the PDDL problem has no {needed} section")
    objects = dict(_typed_list(sections[":objects"], source))
    init: set[Atom] = set()
    for item in sections[":init"]:
        if not isinstance(item, list) or not item or not all(isinstance(x, str) for x in item):
            if isinstance(item, list) and item and item[0] == "=":
                continue  # numeric fluent (distance), ignored by the engine
            raise GameFileError(
                f"{source}: unsupported initial fact {item!r} (only plain atoms are supported)"
            )
        atom = tuple(str(x) for x in item)
        if atom[0] == "=":
            continue
        unknown = [a for a in atom[1:] if a not in objects]
        if unknown:
            raise GameFileError(f"{source}: initial fact {atom} uses undeclared objects {unknown}")
        _check_arity(atom[0], len(atom) - 1, predicates, f"{source}: initial fact {atom}")
        init.add(atom)
    goal_body = sections[":goal"]
    if len(goal_body) != 1:
        raise GameFileError(f"{source}: the :goal section must hold one formula")
    try:
        goal = _formula(goal_body[0], source, objects, predicates)
    except RecursionError:
        raise GameFileError(f"{source}: the goal formula is nested too deeply") from None
    return objects, frozenset(init), goal


def _typed_list(items: list[SExpr], source: str) -> list[tuple[str, str]]:
    """`a b - t1 c - t2` -> [(a, t1), (b, t1), (c, t2)] (untyped names get 'object')."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    i = 0
    while i < len(items):
        tok = items[i]
        if not isinstance(tok, str):
            raise GameFileError(f"{source}: unexpected {tok!r} in a typed list")
        if tok == "-":
            if i + 1 >= len(items) or not isinstance(items[i + 1], str):
                raise GameFileError(f"{source}: '-' without a type in a typed list")
            out += [(name, str(items[i + 1])) for name in pending]
            pending = []
            i += 2
            continue
        pending.append(tok)
        i += 1
    out += [(name, "object") for name in pending]
    return out


def _check_arity(pred: str, n: int, predicates: dict[str, int] | None, what: str) -> None:
    expected = 2 if pred == "=" else (predicates or {}).get(pred)
    if expected is not None and expected != n:
        raise GameFileError(f"{what}: {pred!r} takes {expected} argument(s), got {n}")


def _formula(
    node: SExpr, source: str, objects: dict[str, str], predicates: dict[str, int] | None = None
) -> Formula:
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise GameFileError(f"{source}: malformed goal formula {node!r}")
    head, rest = node[0], node[1:]
    match head:
        case "and":
            return And(tuple(_formula(x, source, objects, predicates) for x in rest))
        case "or":
            return Or(tuple(_formula(x, source, objects, predicates) for x in rest))
        case "not":
            if len(rest) != 1:
                raise GameFileError(f"{source}: (not ...) takes one formula, got {len(rest)}")
            return Not(_formula(rest[0], source, objects, predicates))
        case "exists" | "forall":
            if len(rest) != 2 or not isinstance(rest[0], list):
                raise GameFileError(f"{source}: malformed ({head} ...) in the goal")
            variables = tuple(_typed_list(rest[0], source))
            body = _formula(rest[1], source, objects, predicates)
            return Exists(variables, body) if head == "exists" else Forall(variables, body)
        case "imply" | "when" | "preference":
            raise GameFileError(
                f"{source}: goal connective {head!r} is not supported by the embedded simulator"
            )
    if not all(isinstance(x, str) for x in rest):
        raise GameFileError(f"{source}: malformed goal atom {node!r}")
    args = tuple(str(x) for x in rest)
    unknown = [a for a in args if not a.startswith("?") and a not in objects]
    if unknown:
        raise GameFileError(f"{source}: goal atom {node!r} uses undeclared objects {unknown}")
    _check_arity(head, len(args), predicates, f"{source}: goal atom {node!r}")
    return Lit(head, args)


# ---------------------------------------------------------------- display names


def demangled_names(init: frozenset[Atom]) -> dict[str, str]:
    """id -> "<class> <n>" for ids with a `_bar_` (the Demangler's numbering, restated)."""
    ids = sorted({arg for atom in init for arg in atom[1:]})
    classes: dict[str, str] = {}
    for id_ in ids:
        prefix, sep, _ = id_.partition("_bar_")
        if sep:
            classes[id_] = prefix + ("basin" if "basin" in id_ else "")
    remaining = Counter(classes.values())
    names: dict[str, str] = {}
    for id_ in ids:  # sorted ids: the first of a class takes the highest number
        if id_ in classes:
            cls = classes[id_]
            names[id_] = f"{cls} {remaining[cls]}"
            remaining[cls] -= 1
    return names
