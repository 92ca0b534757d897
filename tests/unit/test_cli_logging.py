"""Where the command line's log records go (dlctl.cli.context.AppContext.configure_logging):
kazoo's warnings at each failed connection attempt only with -v."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from dlctl.cli.context import AppContext


def warn_like_kazoo(verbosity: int) -> str:
    stderr = io.StringIO()
    app = AppContext(verbosity=verbosity, stderr=Console(file=stderr, width=200))
    app.configure_logging()
    try:
        logging.getLogger("kazoo.client").warning("Connection dropped: socket connection error: Connection refused")
        logging.getLogger("dlctl.test").warning("a warning of dlctl's own")
    finally:
        app.restore_logging()
    return stderr.getvalue()


@pytest.mark.parametrize("verbosity,shown", [(-1, False), (0, False), (1, True), (2, True)])
def test_kazoo_connection_warnings_show_only_with_v(verbosity, shown):
    before = logging.getLogger("kazoo").level
    said = warn_like_kazoo(verbosity)
    assert ("Connection dropped" in said) is shown
    assert ("a warning of dlctl's own" in said) is (verbosity >= 0)
    assert logging.getLogger("kazoo").level == before, "restore_logging puts kazoo's level back"
