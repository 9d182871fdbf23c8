"""The repository's shape: no import cycle, no oversized module, and every document the code or
docs cite is in the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "routing", "rollout_workers", "learner", "skillbank_service", "deploy", "weightsync")
SIZE_CHECKED = ("learner", "deploy", "rollout_workers", "routing", "skillbank_service", "weightsync")
MAX_LINES = 500


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root, children_of_root in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(children_of_root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    """Function-level (lazy) imports count too: a cycle hidden in a function is still a cycle."""
    g = grimp.build_graph(*PACKAGES)
    graph = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    assert _cycles(graph) == []


@pytest.mark.parametrize("package", SIZE_CHECKED)
def test_no_module_over_the_size_limit(package):
    big = {str(p.relative_to(ROOT)): n for p in (ROOT / package).rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"split these modules (limit {MAX_LINES} lines): {big}"


_DOC_REF = re.compile(r"(?<![\w/.-])((?:docs/)?[A-Za-z_][\w-]*\.md)\b")


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for package in (*PACKAGES, "tests", "bench"):
        files += sorted(p for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".sh"))
    return [f for f in files if f.is_file()]


def test_every_cited_document_is_in_the_repository():
    missing: dict[str, set[str]] = {}
    for src in _sources():
        for name in _DOC_REF.findall(src.read_text(errors="replace")):
            candidates = [ROOT / name, src.parent / name, ROOT / "docs" / name]
            if not any(c.is_file() for c in candidates):
                missing.setdefault(name, set()).add(str(src.relative_to(ROOT)))
    assert missing == {}, f"documents cited but not in the repository: {missing}"


# ---- environment-neutral core -----------------------------------------------------------------------
ENV_NEUTRAL = ("routing", "rollout_workers", "learner", "deploy")
"""Packages that reach every environment through its plugin (`envs.api`), never by its name."""
KNOWN_ENV_NAMES = frozenset({"alfworld", "webshop", "scienceworld", "keyroom"})
"""Every environment this repository ships or documents (built-in, plugins/, examples/): the
registered ones are added at run time."""


def _env_keyed_lines(source: str, names: frozenset[str]) -> list[int]:
    """Lines where an environment's name (a string constant) keys a branch or a table: a comparison
    (`==`, `!=`, `in`, also inside a tuple/list/set), a dict key, a match case, a subscript
    (`table["webshop"]`, `Literal["alfworld", ...]`)."""

    def names_env(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.lower() in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_env(e) for e in node.elts)
        return False

    lines = []
    for node in ast.walk(ast.parse(source)):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        elif isinstance(node, ast.Subscript):
            operands = [node.slice]
        if any(names_env(o) for o in operands):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_env_name_finder_finds_branches_and_tables():
    names = frozenset({"alfworld", "webshop"})
    source = '''
if env == "alfworld": pass
x = env in ("webshop", "other")
PROFILES = {"alfworld": 1}
y = PROFILES["webshop"]
Name = Literal["alfworld", "webshop"]
match env:
    case "webshop": pass
ok = plugin_for(cfg).name
msg = f"unknown env {env!r}"
default = "alfworld"
'''
    assert _env_keyed_lines(source, names) == [2, 3, 4, 5, 6, 8]


def test_core_holds_no_branch_or_table_keyed_by_an_env_name():
    from envs.registry import registered_names

    names = KNOWN_ENV_NAMES | set(registered_names())
    found = {str(p.relative_to(ROOT)): lines for package in ENV_NEUTRAL for p in sorted((ROOT / package).rglob("*.py"))
             if (lines := _env_keyed_lines(p.read_text(), names))}
    assert found == {}, ("an environment's own code belongs with the environment (its plugin, envs.api); "
                         f"these lines key a branch or table by an env name: {found}")


def test_env_specific_modules_live_with_their_environment():
    """No tracker, prompt or parity module of one environment in the environment-neutral packages."""
    stray = [str(p.relative_to(ROOT)) for package in ENV_NEUTRAL for p in (ROOT / package).rglob("*.py")
             if any(name in p.stem.lower() for name in KNOWN_ENV_NAMES)]
    assert stray == []
