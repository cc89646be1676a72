"""Development tools: a lich of our own, a simulated session, and the demo.

Nothing in the daemon imports these, except `dev.sim` behind `--engine sim`.
"""
