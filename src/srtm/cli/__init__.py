"""The ``srtm`` command line: the app, assembled. Each command lives in a module named for
its group (``srtm.cli.analysis``, ``serve``, ``placement``, ``pipeline``, ``utility``,
``experiment``, ``demo``, ``calibrate``), where it only parses flags and calls a package."""

from __future__ import annotations

from typing import Annotated

import typer

from srtm.cli import analysis, placement, serve
from srtm.cli.calibrate import calibrate
from srtm.cli.demo import demo
from srtm.cli.experiment import app as experiment_app
from srtm.cli.help import plain_flags, unwrap_help
from srtm.cli.pipeline import app as pipeline_app
from srtm.cli.utility import app as utility_app
from srtm.version import package_version

app = typer.Typer(
    help="SRTM: scalable real-time pub/sub messaging with DRL-aware load distribution.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        print(package_version())
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """SRTM command line; see each command's --help."""


app.command("drl-penalty")(analysis.drl_penalty)
app.command("broker")(serve.broker)
app.command("place")(placement.place_command)
app.command("rebalance")(placement.rebalance_command)
app.command("controller")(serve.controller)
app.command("node", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    serve.node
)
app.add_typer(experiment_app, name="experiment")
app.command("demo")(demo)
app.command("calibrate")(calibrate)
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(utility_app, name="utility")

unwrap_help(app)
plain_flags()
