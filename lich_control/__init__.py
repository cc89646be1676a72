"""lich-control: the client that lets lich drive a live Claude Code session."""

__version__ = "0.1.0"
