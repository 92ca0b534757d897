"""``dlctl config show``: the effective configuration, secrets never shown."""

from __future__ import annotations

import click

from .context import AppContext, command_options, pass_app


@click.group("config")
def config_group() -> None:
    """Inspect the configuration (inventory) file."""


@config_group.command("show")
@command_options
@pass_app
def config_show(app: AppContext) -> None:
    """Show where the configuration comes from and what it defines.

    Secret files are shown by path only; their contents never leave them.
    """
    location = app.config
    inv = app.inventory()
    app.render({"file": str(location.path) if location.path else None, "source": location.source, "selected_cluster": app.cluster or inv.default_cluster, **inv.to_dict()})
