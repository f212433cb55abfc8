"""The ``weir`` command line: key-group questions, checkpoint inspection, explicit
recovery of Spark stages, the demo."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from weir import __version__
from weir.state.keygroups import (
    assign_to_key_group,
    compute_default_max_parallelism,
    compute_operator_index_for_key_group,
    key_group_range_for_operator,
)

app = typer.Typer(help="weir: Flink's state management and fault tolerance, in Python.",
                  no_args_is_help=True)


@app.command()
def version() -> None:
    """Print weir's version."""
    typer.echo(__version__)


_KEYS_HELP = (
    "Keys; JSON values (42, '[\"a\", 1]') are parsed, anything else is taken as a string."
)


@app.command()
def keygroup(
    keys: Annotated[list[str], typer.Argument(help=_KEYS_HELP)],
    max_parallelism: Annotated[int, typer.Option("--max-parallelism", "-m")] = 128,
    parallelism: Annotated[int, typer.Option("--parallelism", "-p")] = 1,
) -> None:
    """Show the key group and owning subtask of each key."""
    table = Table(title=f"max_parallelism={max_parallelism}, parallelism={parallelism}")
    for col in ("key", "key group", "subtask", "subtask's key groups"):
        table.add_column(col)
    for raw in keys:
        try:
            key = json.loads(raw)
            key = tuple(key) if isinstance(key, list) else key
        except json.JSONDecodeError:
            key = raw
        group = assign_to_key_group(key, max_parallelism)
        index = compute_operator_index_for_key_group(max_parallelism, parallelism, group)
        kgr = key_group_range_for_operator(max_parallelism, parallelism, index)
        table.add_row(repr(key), str(group), str(index), str(kgr))
    Console().print(table)


@app.command("default-max-parallelism")
def default_max_parallelism(parallelism: int) -> None:
    """Print the max parallelism Flink would choose for a parallelism."""
    typer.echo(compute_default_max_parallelism(parallelism))


checkpoint_app = typer.Typer(help="Checkpoints and savepoints.", no_args_is_help=True)
app.add_typer(checkpoint_app, name="checkpoint")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@checkpoint_app.command("inspect")
def checkpoint_inspect(
    path: Annotated[str, typer.Argument(help="Checkpoint (chk-N) or savepoint directory URL")],
    verify: Annotated[bool, typer.Option(help="Verify every file's checksum")] = True,
) -> None:
    """Show a checkpoint's or savepoint's operators, subtasks, key groups, sizes and
    states, and verify its files. Exits with 1 if a file is missing or corrupt."""
    from weir.checkpoint.coordinator import load_checkpoint
    from weir.checkpoint.format import (
        KeyedChangelogHandle,
        KeyedFullHandle,
        KeyedIncrementalHandle,
    )
    from weir.errors import WeirError

    console = Console()
    try:
        completed = load_checkpoint(path, verify=False)
    except WeirError as exc:
        console.print(f"[red]cannot read {path}:[/red] {exc}")
        raise typer.Exit(1) from None
    meta = completed.metadata
    console.print(
        f"[bold]{meta.kind.value} {meta.checkpoint_id}[/bold] at {completed.url}\n"
        f"format version {meta.format_version}, triggered {meta.trigger_timestamp_ms} ms, "
        f"took {meta.duration_ms:.1f} ms, {_size(meta.total_bytes)} in "
        f"{len(meta.files())} files"
    )
    if meta.source_positions:
        console.print(f"source positions: {json.dumps(dict(meta.source_positions))}")
    for uid, stage in sorted((meta.source_positions.get("spark_stages") or {}).items()):
        offsets = stage.get("source_offsets")
        if offsets:
            console.print(
                f"operator {uid!r}: state reflects Spark batch {offsets['batch']} of "
                f"{offsets['spark_checkpoint']}; source end offsets "
                f"{json.dumps(offsets['offsets'])}"
            )
    for uid, op in sorted(meta.operators.items()):
        table = Table(
            title=f"operator {uid!r}: parallelism {op.parallelism}, "
            f"max parallelism {op.max_parallelism}"
        )
        for col in ("subtask", "key groups", "keyed", "size", "sync ms", "async ms", "states"):
            table.add_column(col)
        for sub in op.subtasks:
            if isinstance(sub.keyed, KeyedIncrementalHandle):
                keyed = f"rocksdb incremental ({len(sub.keyed.shared)} shared SST)"
            elif isinstance(sub.keyed, KeyedChangelogHandle):
                keyed = (f"changelog (base {sub.keyed.base.file.size} B, "
                         f"{len(sub.keyed.deltas)} deltas "
                         f"{sum(d.file.size for d in sub.keyed.deltas)} B)")
            elif isinstance(sub.keyed, KeyedFullHandle):
                keyed = f"full ({len(sub.keyed.key_groups)} key groups with data)"
            else:
                keyed = "-"
            states = [
                f"{m.name}: {m.kind.value} {'/'.join(m.serializers)}{' ttl' if m.ttl else ''}"
                for m in sub.metas.values()
            ]
            states += [f"{n}: operator {mode.value} {ser}"
                       for n, (mode, ser) in sub.operator_states.items()]
            states += [f"{n}: broadcast {'/'.join(sers)}"
                       for n, sers in sub.broadcast_states.items()]
            table.add_row(
                str(sub.subtask_index), str(sub.key_group_range), keyed,
                _size(sum(f.size for f in sub.files())), f"{sub.stats.sync_ms:.1f}",
                f"{sub.stats.async_ms:.1f}", "\n".join(states) or "-",
            )
        console.print(table)
    if not verify:
        return
    bad = 0
    for ref in meta.files():
        try:
            completed.storage.verify(ref)
        except WeirError as exc:
            bad += 1
            console.print(f"[red]CORRUPT[/red] {exc}")
    if bad:
        console.print(f"[red]{bad} of {len(meta.files())} files missing or corrupt[/red]")
        raise typer.Exit(1)
    console.print(f"[green]all {len(meta.files())} files verified (size and SHA-256)[/green]")


spark_app = typer.Typer(help="Stages of the Spark runtime.", no_args_is_help=True)
app.add_typer(spark_app, name="spark")


@spark_app.command("recover")
def spark_recover(
    location: Annotated[str, typer.Argument(help="The stage's checkpoint_location.")],
    uid: Annotated[str, typer.Option("--uid", help="The stage's operator uid.")],
    source: Annotated[str, typer.Option(
        "--from", help="'latest' (newest intact checkpoint), 'empty', or a checkpoint or "
        "savepoint URL.")] = "latest",
    force: Annotated[bool, typer.Option(
        "--force", help="Even if the owner query may still be running.")] = False,
) -> None:
    """Choose what a stage continues from when it cannot go on by itself (its state is
    missing or corrupt, or a batch was only partly computed); the next query that runs
    the stage adopts it."""
    from weir.errors import WeirError
    from weir.spark import recover

    try:
        typer.echo(recover(location, uid, source, force=force))
    except WeirError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc


@app.command()
def demo() -> None:
    """Run the fraud-detection demo."""
    from weir.examples.fraud_demo import main as demo_main

    raise typer.Exit(demo_main())


def main() -> None:
    """Console-script entry point."""
    app()
