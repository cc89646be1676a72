"""lich-control: the client that lets lich drive a live Claude Code session."""

__version__ = "0.1.0"

# The lich-plugin release whose contract this client speaks, sent on every
# request as X-Lich-Plugin: lich checks it against the releases it supports
# and gates features on it. It moves with the contract, not with our version:
# `command` and `ask` came with 0.15.0, the `notification` prompt with 0.16.0.
CONTRACT_RELEASE = "0.16.0"
