"""scalelab launcher: experiment spec, `launch` CLI, backend interface and run store."""

__version__ = "0.1.0"
