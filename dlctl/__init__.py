"""dlctl: operator toolkit and runtime library for a geo-replicated log.

The library never prints and never imports ``dlagent``; the command line lives in
``dlctl.cli`` and is the only layer that talks to the terminal.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("dlctl")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
