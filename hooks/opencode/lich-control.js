// The relay of the bridge (protocol 1) inside opencode: the lich_control
// daemon does the contract; this plugin only starts it, carries its calls
// onto opencode's own server API (the in-process `client`), posts back
// results and turn events, and applies the overrides to each request.
// docs/opencode.md says which session it drives and what each call does.
//
// This file is the plugin: the gate and the hooks. Its parts are modules
// beside it, by role: relay/daemon.js runs the daemon's process,
// relay/sessions.js follows the session lich drives and its turns,
// relay/calls.js performs the daemon's calls; ../bridge.js is the part of
// the bridge the Claude Code relay shares. opencode loads as a plugin only
// the file its configuration names (and the files at the top of a plugins
// folder), so none of them is taken for a plugin of its own.

import { spawn } from 'node:child_process'
import { homedir } from 'node:os'
import { join } from 'node:path'
import { isMainThread } from 'node:worker_threads'

import { Bridge, systemPythons } from '../bridge.js'
import { Calls } from './relay/calls.js'
import { postToDaemon, runDaemon, setUpPython } from './relay/daemon.js'
import { Sessions } from './relay/sessions.js'

const VARIABLES = ['LICH_PORT', 'LICH_TOKEN', 'LICH_SESSION_ID']
// The interactive TUI runs opencode's server, plugins included, in this
// worker; `opencode run` and `opencode serve` run it on the main thread.
const TUI_WORKER = /[\\/]cli[\\/]tui[\\/]worker\.[cm]?[jt]s$/
// Requests opencode makes for itself, not for the conversation: no effort there.
const OWN_AGENTS = new Set(['title', 'summary', 'compaction'])

// One relay per opencode process, however many projects it opens; a reload
// disposes it, and the plugin's next load starts another.
let running = null

export default {
  id: 'lich-control',
  server: (input, options) => plugin(input, options, { env: process.env, argv: process.argv, isMainThread, platform: process.platform }),
}

// `where`: the process the plugin was loaded in, {env, argv, isMainThread, platform}.
export async function plugin({ client }, options = {}, where) {
  if (running !== null || !insideLich(where)) return {}
  const named = typeof options?.python === 'string' && options.python.trim() ? options.python.trim() : null
  const relay = (running = new Relay({
    client,
    python: named,
    platform: where.platform,
    // opencode keeps no folder per plugin: this one is beside its own data.
    data: join(process.env.XDG_DATA_HOME || join(homedir(), '.local', 'share'), 'opencode', 'lich-control'),
    onStop: () => {
      if (running === relay) running = null
    },
  }))
  relay.start()
  return relay.hooks()
}

// An `opencode run` from a tool inside a lich session inherits its variables:
// only the interactive TUI may take the session's commands.
export function insideLich({ env, argv, isMainThread }) {
  return VARIABLES.every(name => Boolean(env[name])) && !isMainThread && TUI_WORKER.test(argv[1] ?? '')
}

export class Relay {
  constructor({ client, python = null, platform = process.platform, data, onStop = () => {}, spawn: launch = spawn, post = postToDaemon, sleep = delay, now = Date.now, abortSettleMs }) {
    // `python` is the interpreter the person named; null: the private
    // environment in `data`, built with the system's Python on `platform`.
    Object.assign(this, { client, python, platform, data, onStop, launch, post, sleep, now })
    this.bridge = new Bridge()
    this.sessions = new Sessions({ client, bridge: this.bridge, sleep, log: this.log })
    this.calls = new Calls({ client, bridge: this.bridge, sessions: this.sessions, log: this.log, abortSettleMs })
    this.child = null
    this.stopped = false
  }

  start() {
    void this.#supervise()
  }

  stop() {
    this.stopped = true
    // A child whose spawn failed has no pid until its error is told, and
    // Node's kill() of it until then signals our own process group (kill(0)).
    // On Windows there are no signals: kill() ends the daemon outright
    // (TerminateProcess), and lich settles what it had in flight as it
    // does for any daemon gone.
    if (this.child?.pid !== undefined) this.child.kill('SIGTERM')
    this.onStop()
  }

  hooks() {
    return {
      event: async ({ event }) => this.sessions.observe(event),
      'chat.message': async (input, output) => {
        await this.sessions.prompted(input.sessionID, output.message)
        // From the next prompt on: no hook changes the model of a request of
        // a turn already running.
        const { model } = this.bridge.overrides
        if (model !== null && output.message) output.message.model = { ...output.message.model, ...model }
      },
      // From memory, so no model request waits on anything.
      'chat.params': async (input, output) => {
        const levels = input.model?.variants
        const effort = this.bridge.overrides.effort
        if (effort !== null && !OWN_AGENTS.has(input.agent) && levels?.[effort]) Object.assign(output.options, levels[effort])
      },
      // Commands run inside the session find the daemon's interpreter (bin/ tools re-run under it).
      'shell.env': async (input, output) => {
        if (this.python !== null) output.env.LICH_CONTROL_PYTHON = this.python
      },
      dispose: async () => this.stop(),
    }
  }

  async #supervise() {
    const log = this.log
    // Off the hooks' back: the session goes on while an environment is built.
    this.python ??= await setUpPython(this.launch, this.data, log, systemPythons(this.platform))
    if (this.python === null) return this.bridge.close()
    await this.bridge.serve({
      run: onLine => runDaemon(this.launch, this.python, { onLine, log, started: child => (this.child = child) }),
      invoke: (method, args) => this.calls.invoke(method, args),
      send: (address, path, body) => this.post(address, path, body),
      now: () => this.now(),
      sleep: ms => this.sleep(ms),
      log,
      stopped: () => this.stopped,
    })
  }

  // opencode's own log (`opencode --print-logs`, or its log folder), each
  // line led by lich-control; bound, as the parts each get it.
  log = (level, text) => {
    const message = text.startsWith('lich-control') ? text : `lich-control: ${text}`
    this.client.app?.log({ body: { service: 'lich-control', level, message } }).catch?.(() => {})
  }
}

function delay(ms) {
  return new Promise(wake => setTimeout(wake, ms))
}
