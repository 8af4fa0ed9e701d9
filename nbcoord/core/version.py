"""nbcoord's version (the package, the control route's summary and the server read it here)."""

__version__ = "0.1.0"
