"""dlagent: the per-node daemon (segment storage, protocol server, write proxy, workers).

Built on the dlctl library; the dlctl library never imports this package.
"""

from dlctl import __version__

__all__ = ["__version__"]
