"""STAGE core: symbolic graphs, autodiff, placements, lowering and the plugin host."""

from .hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]
