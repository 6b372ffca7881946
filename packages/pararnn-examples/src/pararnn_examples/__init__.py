"""pararnn_examples."""

__version__ = "0.1.0"
