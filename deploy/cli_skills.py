"""`python -m deploy skills ...`: live inspection of a run's skill bank (named Ray actor).

Each command joins the cluster at --address as a separate driver, looks up the "skillbank" actor
in --namespace (the run name) and prints rich tables; nothing here writes to the bank."""

from __future__ import annotations

from typing import Annotated

import typer

from deploy.errors import UserError

skills_app = typer.Typer(no_args_is_help=True, help="Inspect a run's skill bank live (ls, show, history, stats).")

AddressOpt = Annotated[str, typer.Option("--address", help="Ray cluster address (host:port of the GCS, or 'auto')")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Ray namespace of the run (its run.name)")]


def _bank(address: str, namespace: str):
    import os

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from deploy.skillbank_actor import get_skillbank

    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError) as err:
        raise UserError(f"cannot join the Ray cluster at --address {address}: {err}; pass the address in the "
                        "run's RUN/ray_address while it trains") from None
    try:
        return ray, get_skillbank(namespace)
    except ValueError as err:
        raise UserError(str(err)) from err


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


@skills_app.command("ls")
def ls(address: AddressOpt, namespace: NamespaceOpt,
       task_type: Annotated[str | None, typer.Option(help="only this task type")] = None,
       width: Annotated[int, typer.Option(help="characters of skill text shown")] = 80) -> None:
    """List the skills of the bank (id, task type, revision, R_align, text)."""
    from rich.console import Console
    from rich.table import Table

    ray, bank = _bank(address, namespace)
    snap = ray.get(bank.snapshot.remote())
    table = Table(title=f"skill bank {namespace} (version {snap.version}, {len(snap.skills)} skills)")
    for col in ("id", "task type", "rev", "step", "R_align", "text"):
        table.add_column(col)
    for s in snap.skills:
        if task_type is None or s.task_type == task_type:
            table.add_row(s.skill_id, s.task_type, str(s.revision), str(s.provenance.step),
                          f"{s.provenance.r_align:+.4f}", _short(s.text, width))
    Console(width=200).print(table)


@skills_app.command("show")
def show(skill_id: Annotated[str, typer.Argument(help="skill id, e.g. s000001")],
         address: AddressOpt, namespace: NamespaceOpt) -> None:
    """One skill in full with its provenance."""
    from rich.console import Console
    from rich.table import Table

    ray, bank = _bank(address, namespace)
    skill = ray.get(bank.get.remote(skill_id))
    if skill is None:
        raise UserError(f"no skill {skill_id!r} in namespace {namespace!r}; `skills ls` lists the ids")
    p = skill.provenance
    table = Table(title=f"skill {skill.skill_id}", show_header=False)
    rows = [("task type", skill.task_type), ("revision", str(skill.revision)), ("step", str(p.step)),
            ("candidate", p.candidate_id), ("sources", ", ".join(p.source_trajectory_ids) or "-"),
            ("R_align", f"{p.r_align:+.6f}"), ("delta+", f"{p.delta_plus:+.6f}"),
            ("delta-", "-" if p.delta_minus is None else f"{p.delta_minus:+.6f}"),
            ("critic", "-" if p.verdict is None else f"{p.verdict.critic}: passed={p.verdict.passed} {p.verdict.reason}"),
            ("schema", str(skill.schema_version)), ("text", skill.text)]
    for k, v in rows:
        table.add_row(k, v)
    Console(width=200).print(table)


@skills_app.command("history")
def history(address: AddressOpt, namespace: NamespaceOpt,
            skill_id: Annotated[str | None, typer.Argument(help="one skill (default: every edit)")] = None,
            width: Annotated[int, typer.Option(help="characters of skill text shown")] = 80) -> None:
    """Applied edits, oldest first (all, or of one skill)."""
    from rich.console import Console
    from rich.table import Table

    ray, bank = _bank(address, namespace)
    entries = ray.get(bank.history.remote(skill_id))
    table = Table(title=f"history of {skill_id or 'the bank'} ({len(entries)} edits)")
    for col in ("#", "op", "id", "rev", "step", "candidate", "R_align", "text"):
        table.add_column(col)
    for i, e in enumerate(entries, start=1):
        table.add_row(str(i), e.op, e.skill_id, str(e.revision), str(e.step), e.candidate_id,
                      f"{e.r_align:+.4f}", _short(e.text, width))
    Console(width=200).print(table)


@skills_app.command("stats")
def stats(address: AddressOpt, namespace: NamespaceOpt,
          decisions: Annotated[int, typer.Option(help="also show the last N decisions")] = 0) -> None:
    """Bank version, skills per task type, adds/updates and decisions by outcome and reason."""
    from rich.console import Console
    from rich.table import Table

    ray, bank = _bank(address, namespace)
    st = ray.get(bank.stats.remote())
    console = Console(width=200)
    table = Table(title=f"skill bank {namespace} (version {st.version})")
    table.add_column("group")
    table.add_column("key")
    table.add_column("count", justify="right")
    edits = {"adds": st.adds, "updates": st.updates}
    for group, counts in (("edits", edits), ("skills", st.num_skills), ("decisions", st.decisions),
                          ("not accepted", st.rejections)):
        for k, v in counts.items():
            table.add_row(group, k, str(v))
    console.print(table)
    if decisions > 0:
        log = Table(title=f"last {decisions} decisions")
        for col in ("step", "candidate", "op", "outcome", "skill", "reason"):
            log.add_column(col)
        for d in ray.get(bank.decisions.remote(decisions)):
            log.add_row(str(d.step), d.candidate_id, d.op or "-", d.outcome, d.skill_id or "-", _short(d.reason, 90))
        console.print(log)
