"""``python -m dlctl.cli``: the same as the ``dlctl`` console script."""

from .main import run

run()
