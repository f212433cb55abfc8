"""The ``weir`` command line: key-group questions, checkpoints (``weir.cli.checkpoint``),
state (``weir.cli.state``), savepoints and dead letters (``weir.cli.lifecycle``), the
checkpoint page (``weir.cli.ui``), a running continuous job (``weir.cli.job``),
explicit recovery of Spark stages, the demo. Every listing
takes ``--json``; every subcommand's ``--help`` shows an example."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from weir import __version__
from weir.cli.checkpoint import checkpoint_app
from weir.cli.common import KEYS_HELP, parse_key
from weir.cli.job import job_app
from weir.cli.lifecycle import dead_letters, savepoint_app
from weir.cli.state import state_app
from weir.cli.ui import ui
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
    """Print weir's version.

    Example: weir version
    """
    typer.echo(__version__)


@app.command()
def keygroup(
    keys: Annotated[list[str], typer.Argument(help=KEYS_HELP)],
    max_parallelism: Annotated[int, typer.Option("--max-parallelism", "-m")] = 128,
    parallelism: Annotated[int, typer.Option("--parallelism", "-p")] = 1,
) -> None:
    """Show the key group and owning subtask of each key.

    Example: weir keygroup acct-17 42 '["eu", 7]' --max-parallelism 128 --parallelism 4
    """
    table = Table(title=f"max_parallelism={max_parallelism}, parallelism={parallelism}")
    for col in ("key", "key group", "subtask", "subtask's key groups"):
        table.add_column(col)
    for raw in keys:
        key = parse_key(raw)
        group = assign_to_key_group(key, max_parallelism)
        index = compute_operator_index_for_key_group(max_parallelism, parallelism, group)
        kgr = key_group_range_for_operator(max_parallelism, parallelism, index)
        table.add_row(repr(key), str(group), str(index), str(kgr))
    Console().print(table)


@app.command("default-max-parallelism")
def default_max_parallelism(parallelism: int) -> None:
    """Print the max parallelism Flink would choose for a parallelism.

    Example: weir default-max-parallelism 200
    """
    typer.echo(compute_default_max_parallelism(parallelism))


app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(state_app, name="state")
app.add_typer(savepoint_app, name="savepoint")
app.add_typer(job_app, name="job")
app.command("dead-letters")(dead_letters)
app.command("ui")(ui)


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
    the stage adopts it.

    Example: weir spark recover /data/chk/fraud --uid fraud-detector --from latest
    """
    from weir.errors import WeirError
    from weir.spark import recover

    try:
        typer.echo(recover(location, uid, source, force=force))
    except WeirError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc


@app.command()
def demo() -> None:
    """Run the fraud-detection demo on Spark local[*].

    Example: weir demo
    """
    from weir.examples.fraud_demo import main as demo_main

    raise typer.Exit(demo_main())


def main() -> None:
    """Console-script entry point."""
    app()
