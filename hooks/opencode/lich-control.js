// The relay of the bridge (protocol 1) inside opencode: the lich_control
// daemon does the contract; this plugin only starts it, carries its calls
// onto opencode's own server API (the in-process `client`), posts back
// results and turn events, and applies the overrides to each request.
// docs/opencode.md says which session it drives and what each call does.

import { spawn } from 'node:child_process'
import { request } from 'node:http'
import { homedir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { isMainThread } from 'node:worker_threads'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..')
// Builds the daemon's private Python environment and names its interpreter,
// as for the Claude Code relay (its docstring has the protocol); run with the system's python3.
const SETUP = join(ROOT, 'hooks', 'lich_runtime.py')
const VARIABLES = ['LICH_PORT', 'LICH_TOKEN', 'LICH_SESSION_ID']
// The interactive TUI runs opencode's server, plugins included, in this
// worker; `opencode run` and `opencode serve` run it on the main thread.
const TUI_WORKER = /[\\/]cli[\\/]tui[\\/]worker\.[cm]?[jt]s$/
const RESTARTS = 5
const FIRST_DELAY_MS = 1000
// A daemon that ran this long before it died earns a fresh restart budget.
const HEALTHY_MS = 60_000
// Exit 2: the daemon refused its configuration (bridge.md); a restart cannot mend that.
const CONFIG_ERROR = 2
// opencode's abort answers at once; the turn is over when the session says idle.
const ABORT_SETTLE_MS = 5000
// Requests opencode makes for itself, not for the conversation: no effort there.
const OWN_AGENTS = new Set(['title', 'summary', 'compaction'])
const NO_OVERRIDES = { model: null, effort: null }

// One relay per opencode process, however many projects it opens; a reload
// disposes it, and the plugin's next load starts another.
let running = null

export default { id: 'lich-control', server: plugin }

async function plugin({ client }, options = {}) {
  if (running !== null || !insideLich({ env: process.env, argv: process.argv, isMainThread })) return {}
  const named = typeof options?.python === 'string' && options.python.trim() ? options.python.trim() : null
  const relay = (running = new Relay({
    client,
    python: named,
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
  constructor({ client, python = null, data, onStop = () => {}, spawn: launch = spawn, post = postOverSocket, sleep = delay, now = Date.now, abortSettleMs = ABORT_SETTLE_MS }) {
    // `python` is the interpreter the person named; null: the private environment in `data`.
    Object.assign(this, { client, python, data, onStop, launch, post, sleep, now, abortSettleMs })
    // Settles with the running daemon's socket at its hello, or with null
    // once no daemon will run (again): posts then drain instead of waiting.
    this.daemon = deferred()
    this.events = Promise.resolve() // the tail of the event chain, posted in order
    this.overrides = NO_OVERRIDES // model as {providerID, modelID}
    this.child = null
    this.stopped = false
    // The sessions as opencode's bus tells them; all written by the hooks.
    this.chosen = null // the session lich drives
    this.creating = null // its creation, while lich's first call makes it
    this.parents = new Map() // session id -> parent id, null for a root
    this.forks = new Set() // lich's asks, never driven
    this.busy = new Set()
    this.turn = null // {id, session, sentTo}: the chosen session's running turn
    this.turns = 0
    this.idleWaiters = []
    this.lastModel = null // the model the chosen session's last prompt asked for
  }

  start() {
    void this.#supervise()
  }

  stop() {
    this.stopped = true
    this.child?.kill('SIGTERM')
    this.onStop()
  }

  hooks() {
    return {
      event: async ({ event }) => this.#observe(event),
      'chat.message': async (input, output) => this.#message(input, output),
      // From memory, so no model request waits on anything.
      'chat.params': async (input, output) => {
        const levels = input.model?.variants
        const effort = this.overrides.effort
        if (effort !== null && !OWN_AGENTS.has(input.agent) && levels?.[effort]) Object.assign(output.options, levels[effort])
      },
      // Commands run inside the session find the daemon's interpreter (bin/ tools re-run under it).
      'shell.env': async (input, output) => {
        if (this.python !== null) output.env.LICH_CONTROL_PYTHON = this.python
      },
      dispose: async () => this.stop(),
    }
  }

  // -- the daemon ---------------------------------------------------------

  async #supervise() {
    // Off the hooks' back: the session goes on while an environment is built.
    this.python ??= await this.#setUp()
    let restarts = 0
    while (!this.stopped && this.python !== null) {
      const began = this.now()
      const end = await this.#run()
      // Its socket and its overrides went with it: the next one starts afresh.
      if (this.daemon.value !== undefined) this.daemon = deferred()
      this.overrides = NO_OVERRIDES
      if (this.stopped || end.code === 0) break
      if (end.code === CONFIG_ERROR) {
        this.log('error', `the daemon ${describe(end)}: its configuration is wrong; not restarting it`)
        break
      }
      if (this.now() - began >= HEALTHY_MS) restarts = 0
      if (restarts === RESTARTS) {
        this.log('error', `the daemon ${describe(end)}; not restarting it again`)
        break
      }
      const wait = FIRST_DELAY_MS * 2 ** restarts
      restarts += 1
      this.log('warn', `the daemon ${describe(end)}; restart ${restarts} of ${RESTARTS} in ${wait} ms`)
      await this.sleep(wait)
    }
    this.daemon.settle(null)
  }

  // Runs hooks/lich_runtime.py to its end: the interpreter it names, or null
  // once the one line that says why there is none is logged. Never throws.
  async #setUp() {
    let stdout = ''
    const end = await new Promise(done => {
      let child
      try {
        child = this.launch('python3', [SETUP, '--data', this.data], { cwd: ROOT, env: process.env, stdio: ['ignore', 'pipe', 'pipe'] })
      } catch (err) {
        done({ error: messageOf(err) })
        return
      }
      child.on('error', err => done({ error: messageOf(err) }))
      child.on('close', (code, signal) => done({ code, signal }))
      child.stdout.setEncoding('utf8').on('data', text => (stdout += text))
      createInterface({ input: child.stderr }).on('line', line => line.trim() && this.log('info', `setup: ${line}`))
    })
    if (end.error !== undefined) {
      this.log('error', `cannot set up its Python environment: python3 did not run (${end.error}). Install Python 3.9 or later, or name an interpreter that has lich-control installed in the plugin's python option (docs/opencode.md)`)
      return null
    }
    let result
    try {
      result = JSON.parse(stdout.trim().split('\n').pop())
    } catch {
      result = undefined
    }
    if (result?.ok === true && typeof result.python === 'string' && result.python) return result.python
    this.log('error', typeof result?.error === 'string'
      ? result.error
      : `cannot set up its Python environment: hooks/lich_runtime.py ${describe(end)} without a result (the lines above say why)`)
    return null
  }

  // Runs the daemon once, to its end; never throws.
  #run() {
    return new Promise(done => {
      let child
      try {
        child = this.child = this.launch(this.python, ['-m', 'lich_control.daemon', '--host', 'opencode'], {
          cwd: ROOT,
          env: process.env,
          // stdin stays open and unused: the daemon stops when it closes.
          stdio: ['pipe', 'pipe', 'pipe'],
        })
      } catch (err) {
        done({ error: messageOf(err) })
        return
      }
      child.on('error', err => done({ error: messageOf(err) }))
      child.on('close', (code, signal) => done({ code, signal }))
      createInterface({ input: child.stdout }).on('line', line => line.trim() && this.#receive(line))
      createInterface({ input: child.stderr }).on('line', line => line.trim() && this.log('info', line))
    })
  }

  #receive(line) {
    let message
    try {
      message = JSON.parse(line)
    } catch {
      this.log('warn', `the daemon wrote a line that is not JSON (${line.length} chars)`)
      return
    }
    if (message?.op === 'hello' && typeof message.socket === 'string' && message.socket) {
      this.log('info', `the daemon ${message.pid} (${message.version}, protocol ${message.protocol}) listens on ${message.socket}`)
      this.daemon.settle(message.socket)
      // A daemon started mid-turn (a restart) would not know the turn to abort.
      if (this.turn !== null && this.turn.sentTo !== this.daemon) this.#forward('turn.start', this.turn)
    } else if (message?.op === 'call') {
      void this.#perform(message, this.daemon)
    } else {
      this.log('warn', `the daemon sent an unknown op ${JSON.stringify(message?.op)}`)
    }
  }

  // Started the moment its line is read and never awaited by the reader.
  async #perform({ id, method, args }, life) {
    let result
    try {
      result = { id, ok: true, value: (await this.#invoke(method, args ?? {})) ?? null }
    } catch (err) {
      result = { id, ok: false, error: messageOf(err) }
    }
    // Call ids start again with each daemon: never settle the next one's.
    if (this.daemon !== life) {
      this.log('warn', `the daemon that asked for ${id} (${method}) has ended; its result is dropped`)
      return
    }
    await this.#post('/v1/result', result)
  }

  #invoke(method, args) {
    switch (method) {
      case 'prompt.submit':
        return this.#prompt(args)
      case 'turn.abort':
        return this.#abort(args)
      case 'command.run':
        return this.#command(args)
      case 'model.fork':
        return this.#fork(args)
      case 'overrides.set':
        return this.#setOverrides(args)
      default:
        throw new Error(`this relay has no method ${method}`)
    }
  }

  #forward(event, turn) {
    turn.sentTo = this.daemon
    const previous = this.events
    this.events = (async () => {
      await previous
      await this.#post('/v1/event', { event, turnId: turn.id })
    })()
  }

  // Waits for the daemon's socket, then posts; never throws.
  async #post(path, body) {
    const socketPath = await this.daemon.promise
    if (socketPath === null) return
    try {
      const { status, text } = await this.post(socketPath, path, body)
      if (status >= 300) this.log('warn', `the daemon answered ${status} to ${path}: ${text.trim()}`)
    } catch (err) {
      this.log('warn', `the daemon unreachable for ${path}: ${messageOf(err)}`)
    }
  }

  // opencode's own log (`opencode --print-logs`, or its log folder), each line led by lich-control.
  log(level, text) {
    const message = text.startsWith('lich-control') ? text : `lich-control: ${text}`
    this.client.app?.log({ body: { service: 'lich-control', level, message } }).catch?.(() => {})
  }

  // -- the calls ----------------------------------------------------------

  // `asUser` has no meaning here: every prompt opencode takes is the user's.
  async #prompt({ text }) {
    const session = await this.#target()
    // Answers once the prompt is admitted; one sent while busy joins the
    // running turn at its next step.
    await answer(this.client.session.promptAsync({ path: { id: session }, body: { parts: [{ type: 'text', text }] } }), 'take the prompt')
    return null
  }

  async #abort({ turnId }) {
    const turn = this.turn
    if (turn === null || turn.id !== turnId) throw new Error(`${turnId} is not the running turn`)
    // abort answers true even for an idle session: ask first.
    const statuses = await answer(this.client.session.status({}), 'tell the session status')
    if (!statuses?.[turn.session] || statuses[turn.session].type === 'idle') throw new Error('no turn is running')
    await answer(this.client.session.abort({ path: { id: turn.session } }), 'abort the turn')
    if (!(await this.#idle(turn.session, this.abortSettleMs))) {
      throw new Error(`opencode took the abort of ${turnId}, but its session was still busy ${this.abortSettleMs / 1000} s later`)
    }
    return null
  }

  async #command({ command, args }) {
    const known = (await answer(this.client.command.list({}), 'list its commands')) ?? []
    if (!known.some(c => c.name === command)) {
      const names = known.map(c => c.name).join(', ') || 'none'
      throw new Error(`opencode has no command /${command} that its API can run (it has: ${names})`)
    }
    const session = await this.#target()
    // As in Claude Code, a command waits for the running turn to end
    // instead of joining it; opencode answers once the command's turn ended.
    await this.#idle(session)
    await answer(this.client.session.command({ path: { id: session }, body: { command, arguments: args ?? '' } }), `run /${command}`)
    return null
  }

  // The ask: a copy of the session answers, tools off, and is deleted; the
  // session itself, and any turn running in it, never see it.
  async #fork({ prompt }) {
    const session = this.chosen
    if (session === null) return { isAnswered: false, reason: 'nothing-to-fork' }
    const fork = await answer(this.client.session.fork({ path: { id: session }, body: {} }), 'fork the session')
    this.forks.add(fork.id)
    try {
      const reply = await answer(
        this.client.session.prompt({ path: { id: fork.id }, body: { tools: { '*': false }, parts: [{ type: 'text', text: prompt }] } }),
        'answer in the fork',
      )
      return forkReply(reply)
    } finally {
      const gone = await this.client.session.delete({ path: { id: fork.id } }).catch(err => ({ error: err }))
      if (gone?.error) this.log('warn', `could not delete its fork ${fork.id}: ${describeError(gone.error)}`)
      this.forks.delete(fork.id)
    }
  }

  // Both at once, each checked against what opencode has: a model it does
  // not know, or an effort the model has no variant for, is refused.
  async #setOverrides({ model = null, effort = null }) {
    if (model === null && effort === null) {
      this.overrides = NO_OVERRIDES
      return null
    }
    const { providers = [] } = (await answer(this.client.config.providers({}), 'list its models')) ?? {}
    const wanted = model === null ? null : findModel(providers, model)
    if (effort !== null) {
      const next = wanted ?? this.lastModel ?? (await this.#defaultModel(providers))
      const levels = next && providers.find(p => p.id === next.providerID)?.models?.[next.modelID]?.variants
      if (levels && !levels[effort]) {
        const have = Object.keys(levels).join(', ') || 'none'
        throw new Error(`${next.providerID}/${next.modelID} has no ${effort} effort in opencode (its levels: ${have})`)
      }
    }
    this.overrides = { model: wanted, effort }
    return null
  }

  async #defaultModel(providers) {
    const config = await answer(this.client.config.get({}), 'read its configuration').catch(() => null)
    return typeof config?.model === 'string' ? findModel(providers, config.model, true) : null
  }

  // -- the sessions -------------------------------------------------------

  // The session lich drives: the root session this process last prompted,
  // or, before any, a new one made for lich and shown in the TUI.
  #target() {
    if (this.chosen !== null) return Promise.resolve(this.chosen)
    this.creating ??= (async () => {
      try {
        const made = await answer(this.client.session.create({ body: {} }), 'create a session')
        this.parents.set(made.id, null)
        this.#choose(made.id)
        // Shown, so the user sees what lich does there; a TUI that cannot be told stays put.
        void this.client.tui.publish({ body: { type: 'tui.session.select', properties: { sessionID: made.id } } }).catch?.(() => {})
        return made.id
      } finally {
        this.creating = null
      }
    })()
    return this.creating
  }

  async #message(input, output) {
    const session = input.sessionID
    if (!this.forks.has(session) && (await this.#isRoot(session))) {
      this.#choose(session)
      this.lastModel = pick(output.message?.model)
    }
    // From the next prompt on: no hook changes the model of a request of a
    // turn already running.
    const { model } = this.overrides
    if (model !== null && output.message) output.message.model = { ...output.message.model, ...model }
  }

  async #isRoot(session) {
    if (!this.parents.has(session)) {
      const info = await answer(this.client.session.get({ path: { id: session } }), 'describe the session').catch(() => null)
      if (info) this.parents.set(session, info.parentID ?? null)
    }
    return this.parents.get(session) === null
  }

  #observe(event) {
    const props = event?.properties ?? {}
    switch (event?.type) {
      case 'session.created':
      case 'session.updated':
        if (props.info?.id) this.parents.set(props.info.id, props.info.parentID ?? null)
        break
      case 'session.deleted':
        if (props.info?.id === this.chosen) this.#choose(null)
        break
      case 'session.status': {
        if (props.status?.type === 'idle') this.busy.delete(props.sessionID)
        else if (props.status?.type) this.busy.add(props.sessionID)
        if (props.sessionID === this.chosen) this.#settleTurn()
        const waiting = this.idleWaiters
        this.idleWaiters = waiting.filter(w => this.busy.has(w.session))
        for (const w of waiting) if (!this.busy.has(w.session)) w.wake(true)
        break
      }
    }
  }

  #choose(session) {
    if (session === this.chosen) return
    this.chosen = session
    if (session !== null) this.lastModel = null
    this.#settleTurn()
  }

  // Turn ids are the relay's own: one per busy -> idle of the chosen session.
  #settleTurn() {
    const busy = this.chosen !== null && this.busy.has(this.chosen)
    if (this.turn !== null && (!busy || this.turn.session !== this.chosen)) {
      this.#forward('turn.complete', this.turn)
      this.turn = null
    }
    if (busy && this.turn === null) {
      this.turn = { id: `o${++this.turns}`, session: this.chosen, sentTo: null }
      this.#forward('turn.start', this.turn)
    }
  }

  // True once the session is idle; false when `ms` ran out first.
  #idle(session, ms) {
    if (!this.busy.has(session)) return Promise.resolve(true)
    return new Promise(wake => {
      this.idleWaiters.push({ session, wake })
      if (ms !== undefined) void this.sleep(ms).then(() => wake(false))
    })
  }
}

// What opencode's reply in the fork means for lich, in $.model.fork's shape.
export function forkReply(reply) {
  const error = reply?.info?.error
  if (error?.name === 'MessageAbortedError') return { isAnswered: false, reason: 'aborted' }
  if (error) return { isAnswered: false, reason: 'api-error', status: error.data?.statusCode ?? null, error: error.name ?? 'unknown' }
  const text = (reply?.parts ?? []).filter(p => p.type === 'text' && !p.synthetic && !p.ignored).map(p => p.text).join('')
  return text.trim() ? { isAnswered: true, text } : { isAnswered: false, reason: 'empty-reply' }
}

// `provider/model`, or a model id only one provider has.
export function findModel(providers, name, quiet = false) {
  const cut = name.indexOf('/')
  const matches = cut > 0
    ? providers.filter(p => p.id === name.slice(0, cut) && p.models?.[name.slice(cut + 1)]).map(p => ({ providerID: p.id, modelID: name.slice(cut + 1) }))
    : providers.filter(p => p.models?.[name]).map(p => ({ providerID: p.id, modelID: name }))
  if (matches.length === 1) return matches[0]
  if (quiet) return null
  if (matches.length > 1) throw new Error(`more than one opencode provider has a model ${name}: name it as ${matches.map(m => `${m.providerID}/${m.modelID}`).join(' or ')}`)
  throw new Error(`opencode has no model ${name} (name it as provider/model; \`opencode models\` lists them)`)
}

// An SDK call's data, or an Error that says what opencode refused.
async function answer(pending, what) {
  const { data, error } = await pending
  if (error !== undefined && error !== null) throw new Error(`opencode could not ${what}: ${describeError(error)}`)
  return data
}

function describeError(error) {
  const text = error?.data?.message ?? error?.message ?? (typeof error === 'string' ? error : JSON.stringify(error))
  return String(text).slice(0, 300)
}

function pick(model) {
  return model?.providerID && model?.modelID ? { providerID: model.providerID, modelID: model.modelID } : null
}

// One request on the daemon's Unix socket (bridge.md); resolves with its answer.
export function postOverSocket(socketPath, path, body) {
  return new Promise((done, fail) => {
    const payload = JSON.stringify(body)
    const req = request({ socketPath, path, method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, res => {
      let text = ''
      res.setEncoding('utf8').on('data', chunk => (text += chunk)).on('end', () => done({ status: res.statusCode, text }))
    })
    req.on('error', fail)
    req.end(payload)
  })
}

// A promise with its resolver beside it; `value` stays undefined until the
// first settle, and later ones change nothing.
function deferred() {
  const box = { value: undefined }
  box.promise = new Promise(resolve => {
    box.settle = value => {
      if (box.value !== undefined) return
      box.value = value
      resolve(value)
    }
  })
  return box
}

function delay(ms) {
  return new Promise(wake => setTimeout(wake, ms))
}

function describe(end) {
  if (end.error !== undefined) return `could not run (${end.error})`
  if (end.signal) return `was ended by ${end.signal}`
  return `exited with ${end.code}`
}

function messageOf(err) {
  return err instanceof Error ? err.message : String(err)
}
