"""Development tools: a lich of our own, a simulated session, the demo, and
the way the tools and the tests start and stop a daemon (procs).

Nothing in the daemon imports these, except `dev.sim` behind `--engine sim`.
"""
