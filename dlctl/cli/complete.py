"""Shell completion of names: the ``shell_complete`` callbacks of cluster, node, log and stream
arguments and options.

Clusters and nodes come from the configuration the command would use (``--config`` and
``--cluster`` typed before the word are honoured); logs and streams from the cluster's ZooKeeper
(dlctl.ops.names, one attempt of at most a second). A completion never prints: whatever goes
wrong — no configuration, ZooKeeper down, a bad file — it offers nothing, and log records
(kazoo's reconnection warnings, the inventory's) are held back while it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import click
from click.shell_completion import CompletionItem

from .. import inventory
from ..config import locate_config, select_cluster
from ..inventory import Cluster, Inventory
from ..ops import names

Finder = Callable[[click.Context, str], list[str]]


def _quietly(find: Finder) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        held = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        try:
            return [CompletionItem(name) for name in find(ctx, incomplete)]
        except Exception:  # noqa: BLE001 - a completion offers nothing rather than an error
            return []
        finally:
            logging.disable(held)

    return complete


def _inventory(ctx: click.Context) -> Inventory:
    return inventory.load(locate_config(ctx.find_root().params.get("config_option")))


def _cluster(ctx: click.Context, name: str | None = None) -> Cluster:
    return _inventory(ctx).cluster(name or select_cluster(ctx.find_root().params.get("cluster_option")))


complete_cluster = _quietly(lambda ctx, prefix: names.clusters(_inventory(ctx), prefix))
complete_node = _quietly(lambda ctx, prefix: names.nodes(_cluster(ctx), prefix))
complete_log = _quietly(lambda ctx, prefix: names.logs(_cluster(ctx), prefix))
# A stream lives in its sink cluster: the command's --sink when typed, else the selected cluster.
complete_stream = _quietly(lambda ctx, prefix: names.streams(_cluster(ctx, ctx.params.get("sink")), prefix))
