"""The ``weir`` command line. Checkpoint inspection, savepoints and rescaling join it
as the checkpoint layer lands; for now it answers key-group questions and runs the demo."""

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


@app.command()
def demo() -> None:
    """Run the fraud-detection demo."""
    from weir.examples.fraud_demo import main as demo_main

    raise typer.Exit(demo_main())


def main() -> None:
    """Console-script entry point."""
    app()
