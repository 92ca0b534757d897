"""``python -m dlagent``: the same as the ``dlagent`` console script."""

from .cli import main

main()
