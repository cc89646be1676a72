# make test   the whole suite (creates .venv unless a virtual environment is active)
# make demo   the main job on the development lich and the simulated session
# make soak   the one-ack property over many more schedules (SOAK_SCHEDULES, 2000: 5 minutes or more)
# make plugin-install   the Claude Code plugin from this clone, for lich's confined sessions too

PYTHON ?= python3
ifdef VIRTUAL_ENV
VENV_PY := $(VIRTUAL_ENV)/bin/python
else
VENV_PY := .venv/bin/python
endif
STAMP := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)/.lich-control-installed

.PHONY: test soak demo run bench bench-setup bench-first-poll plugin-check opencode-check canary release-table install plugin-install clean

$(STAMP): setup.cfg pyproject.toml
	@if [ -z "$(VIRTUAL_ENV)" ] && [ ! -x .venv/bin/python ]; then $(PYTHON) -m venv .venv; fi
	$(VENV_PY) -m pip install --quiet --upgrade pip
	$(VENV_PY) -m pip install --quiet -e '.[test]'
	@touch $@

install: $(STAMP)

test: $(STAMP)
	$(VENV_PY) -m pytest

# The one-ack property of tests/test_daemon_acks.py, which make test runs
# on seeds 0-99, over SOAK_SCHEDULES more (from seed 1000): it prints the
# commands lich handed out, the acks, and each daemon's RSS at its first
# poll and before its stop (docs/performance.md, "The one-ack soak").
SOAK_SCHEDULES ?= 2000
soak: $(STAMP)
	SOAK_SCHEDULES=$(SOAK_SCHEDULES) $(VENV_PY) -m pytest tests/test_daemon_acks.py -k soak -s

demo: $(STAMP)
	PYTHONPATH=tests $(VENV_PY) -m lich_dev.demo

# Keeps a development lich and a daemon on the simulated session up for
# driving by hand with tests/lich-stub control (it prints how).
run: $(STAMP)
	PYTHONPATH=tests $(VENV_PY) -m lich_dev.demo --run

# Not part of make test (which runs it once with --smoke): a minute or two.
# It measures the daemon as `pip install .` deploys it: an editable install's
# import hook alone adds ~40 ms to every start.
bench:
	@[ -x .venv-bench/bin/python ] || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install --quiet --upgrade pip
	.venv-bench/bin/python -m pip install --quiet --force-reinstall --no-deps . && .venv-bench/bin/python -m pip install --quiet .
	PYTHONPATH=tests .venv-bench/bin/python -m lich_bench $(BENCH_ARGS)

# What the plugin's setup costs a session (hooks/lich_runtime.py): the first
# one, with a new data folder and pip cache (it downloads packages), and the
# next, which finds the environment ready. CPU and wall time; a few seconds a run.
bench-setup:
	PYTHONPATH=tests $(PYTHON) -m lich_bench.setup $(BENCH_ARGS)

# From launching the pinned Claude Code to the daemon's first poll, in a
# first session (it sets the daemon's Python up) and a next one: live, as
# plugin-check's sessions run (Node.js and npm for Claude Code; a minute).
bench-first-poll: $(STAMP)
	PYTHONPATH=tests:tests/live $(VENV_PY) tests/live/bench_first_poll.py $(BENCH_ARGS)

# The relay inside the pinned Claude Code, and end to end with the daemon;
# then the opencode relay, live in the pinned opencode.
plugin-check: $(STAMP)
	PYTHON=$(abspath $(VENV_PY)) .ci/plugin-checks
	PYTHON=$(abspath $(VENV_PY)) .ci/opencode-checks

# The live session check on npm's newest Claude Code, which CI (pinned)
# never runs; the degrade checks too where its mod did not run. One line:
# the release, and pass or the checks that failed. RELEASE=x.y.z checks
# that one instead. A few minutes; Node.js, npm and the registry.
canary: $(STAMP)
	$(VENV_PY) tests/live/canary.py $(RELEASE)

# docs/install.md's "Which Claude Code" table, written anew from the
# releases measured (TABLE in tests/live/releases.py); make test fails
# while the two differ.
release-table: $(STAMP)
	$(VENV_PY) tests/live/releases.py

# The opencode relay alone: its logic under node --test, then live (about a minute).
opencode-check: $(STAMP)
	PYTHON=$(abspath $(VENV_PY)) .ci/opencode-checks

# The plugin from this clone, installed for the Claude Code on PATH (or
# CLAUDE=...). Claude Code reads a marketplace added from a folder in that
# folder at every session start, and lich's confined sessions do not see a
# clone in ~/src: so the plugin's files (as committed, with the changes to
# tracked files made since: git stash create) are copied under
# ~/.local/share, which the sandbox mounts, and added from there. Run again
# to install a newer state of the clone; a session started after it runs it.
# The index is refreshed first: git stash create fails on a file whose
# timestamp alone changed (a fresh checkout, a touched file).
PLUGIN_HOME ?= $(HOME)/.local/share/lich-control/plugin
CLAUDE ?= claude
plugin-install:
	@command -v '$(CLAUDE)' >/dev/null || { echo "make plugin-install: no $(CLAUDE) on PATH; install Claude Code, or name it: make plugin-install CLAUDE=/path/to/claude" >&2; exit 1; }
	rm -rf '$(PLUGIN_HOME).new' && mkdir -p '$(PLUGIN_HOME).new'
	git update-index -q --refresh
	tree=$$(git stash create) && git archive "$${tree:-HEAD}" | tar -x -C '$(PLUGIN_HOME).new'
	rm -rf '$(PLUGIN_HOME)' && mv '$(PLUGIN_HOME).new' '$(PLUGIN_HOME)'
	'$(CLAUDE)' plugin marketplace add '$(PLUGIN_HOME)'
	'$(CLAUDE)' plugin install lich-control@lich-control

clean:
	rm -rf .venv .venv-bench build *.egg-info .pytest_cache .hypothesis
