"""twoclocks: measure the progress and failure clocks of RLVR training across batch sizes."""

__version__ = "0.1.0"
