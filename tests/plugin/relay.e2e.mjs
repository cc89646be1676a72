// End to end, with Node's own test runner and nothing installed: the relay
// (hooks/mod-control.js) runs on a `$` whose process.spawn starts the real
// Python daemon and whose http.fetch really speaks HTTP to it (its Unix
// socket, or on Windows its loopback port with the secret, whichever the
// relay asks for), against the development lich (tests/lich_dev) on loopback.
// Commands queued in lich must reach the fake session through both halves
// and come back as acks.
//
//   node --test tests/plugin/relay.e2e.mjs     (PYTHON picks the interpreter)
//
// Under Wine (.ci/windows-checks) it runs as `node.exe tests/plugin/relay.e2e.mjs`
// with Windows Python: the relay, daemon and lich as on Windows.
//
// It holds to bridge.md and the contract only, so any conforming daemon passes.
//
// Two settings run it as an installed plugin would (tests/live/test_landlock.py,
// from the installed copy, in the stand-in for lich's macOS profile):
//   LICH_E2E_PLUGIN_DATA  no python option: the relay runs the setup with this
//                         data folder (Claude Code's CLAUDE_PLUGIN_DATA)
//   LICH_E2E_RUN_DIR=default  no LICH_CONTROL_RUN_DIR: the daemon's own choice
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync, unlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { createInterface } from 'node:readline'
import { after, before, test } from 'node:test'
import { fileURLToPath, pathToFileURL } from 'node:url'
import assert from 'node:assert/strict'

import { SECRET_HEADER } from '../../hooks/bridge.js'
import { postToDaemon } from '../../hooks/opencode/relay/daemon.js'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const PYTHON = process.env.PYTHON || 'python3'
// The contract release the daemon names in X-Lich-Plugin, from its one constant.
const CONTRACT_RELEASE = /CONTRACT_RELEASE = "([^"]+)"/.exec(readFileSync(join(ROOT, 'lich_control', '__init__.py'), 'utf8'))[1]
const TOKEN = 'e2e-secret-token-5f3a'
const SESSION = 'card-e2e'
const ASK = 'what are you working on?'
const WINDOWS = process.platform === 'win32'
const PLUGIN_DATA = process.env.LICH_E2E_PLUGIN_DATA
const DEFAULT_RUN_DIR = process.env.LICH_E2E_RUN_DIR === 'default'
const SETUP = /lich_runtime\.py$/

// The development lich, driven over its stdin: it prints its port, waits
// for the session's first poll, then queues each command line it reads
// and prints what came back, with the release the mod's requests named
// (X-Lich-Plugin). A request with another token is refused, and one for
// another session_id is not this session's poll.
const LICH = `
import json, os, sys
from lich_dev.lich import StubLich
session = os.environ["LICH_SESSION_ID"]
with StubLich(token=os.environ["LICH_TOKEN"]) as lich:
    print(lich.port, flush=True)
    assert lich.wait_polled(session, timeout=30), "the daemon never polled"
    for line in sys.stdin:
        # lich refuses a command for a session no daemon polls for (one restarting).
        assert lich.wait_polled(session, timeout=30, parked=True), "no daemon polls"
        outcome = lich.send(session, json.loads(line), timeout=30)
        print(json.dumps({"ack": outcome.ack, "plugin": lich.polled(session).plugin}), flush=True)
`

// Claude Code as far as the relay sees it: the $ it calls and the hooks it
// fires. The session runs one main-loop turn at a time.
class FakeSession {
  hooks = {}
  logs = []
  // Called with each line $.ui.status pins.
  shown = () => {}
  // Set, Claude Code refuses every $.http.fetch, why in these words (2.1.280
  // to 2.1.287 while nonessential traffic is off).
  refusal = undefined
  // The daemons it started; the setup's runs, apart.
  children = []
  setups = []
  prompts = []
  forks = []
  steps = []
  fetched = []
  running = null
  turns = 0
  static loads = 0

  constructor(env) {
    this.env = env
    this.$ = this.#engine()
  }

  async load() {
    // A query of its own gives each session a fresh copy of the module's
    // state, as a session's load does (bridge.js, which holds none, is shared).
    const url = `${pathToFileURL(join(ROOT, 'hooks', 'mod-control.js'))}?session=${++FakeSession.loads}`
    const { register } = await import(url)
    register((event, hook) => (this.hooks[event] = hook), {})
  }

  fire(event, e, result) {
    return this.hooks[event](this.$, e, async () => result)
  }

  async step(e) {
    const beneath = async function* (sent) {
      this.steps.push(sent)
      return { turnId: sent.turnId, index: sent.index, answer: '', toolUses: [], stopReason: 'end_turn', usage: null }
    }.bind(this)
    const stream = this.hooks['turn.step'](this.$, e, beneath)
    for await (const _ of stream);
  }

  async #startTurn(text) {
    this.turns += 1
    this.running = `t${this.turns}`
    await this.fire('turn.start', { text, turnId: this.running }, { turnId: this.running })
  }

  async #endTurn(isAborted) {
    const turnId = this.running
    this.running = null
    const reason = isAborted ? 'aborted' : 'answer'
    await this.fire('turn.complete', { answer: '', durationMs: 1, isAborted, turnId, reason }, { text: '' })
  }

  #engine() {
    const session = this
    return {
      plugin: { name: 'lich-control', root: ROOT },
      env: {
        get: async name => session.env[name],
        set: async (name, value) => ((session.env[name] = value), {}),
      },
      // The python option, where a person sets it: their own settings file.
      settings: {
        read: async ({ source, key } = {}) => {
          if (key !== undefined) return undefined
          if (source !== 'user' || PLUGIN_DATA) return {}
          return { pluginConfigs: { 'lich-control': { options: { python: PYTHON } } } }
        },
      },
      ui: {
        log: text => session.logs.push(text),
        status: text => {
          if (text !== undefined) session.shown(text)
        },
      },
      // Where Claude Code would say it runs: this machine, in its words.
      session: { info: async () => ({ platform: { win32: 'windows', darwin: 'macos' }[process.platform] ?? 'linux' }) },
      clock: { sleep: ms => new Promise(resolve => setTimeout(resolve, ms).unref()), now: async () => Date.now() },
      process: {
        hookEnv: async () => ({
          CLAUDE_PID: String(process.pid),
          CLAUDE_PLUGIN_ROOT: ROOT,
          ...(PLUGIN_DATA && { CLAUDE_PLUGIN_DATA: PLUGIN_DATA }),
        }),
        spawn: request => session.#spawn(request),
      },
      // As Claude Code's fetch: its gate, its check of the URL, then on the
      // socket it names, else to the URL's port (loopback), with the headers
      // the relay gave.
      http: {
        fetch: async (url, init) => {
          if (session.refusal !== undefined) throw new Error(`lich-control: $.http.fetch: refused: ${session.refusal}`)
          if (!/^https?:/.test(url)) throw new Error(`lich-control: $.http.fetch: ${url} refused: http or https only`)
          const { port, pathname } = new URL(url)
          const address = init.socketPath !== undefined ? { socket: init.socketPath } : { port: Number(port), secret: init.headers?.[SECRET_HEADER] }
          session.fetched.push({ url, socketPath: init.socketPath, secret: address.secret })
          return postToDaemon(address, pathname, JSON.parse(init.body))
        },
      },
      prompt: {
        // As Claude Code's: resolves once the prompt's turn has started.
        submit: async args => {
          session.prompts.push(args)
          await session.#startTurn(args.text)
          return { text: args.text }
        },
      },
      turn: {
        abort: async ({ turnId }) => {
          if (turnId !== session.running) throw new Error(`${turnId} is not the running turn (${session.running})`)
          await session.#endTurn(true)
        },
      },
      // /hold is held until the test calls session.release(), `held` settling as it begins.
      command: {
        run: async ({ command }) => {
          if (command === 'hold') await new Promise(release => ((session.release = release), session.begun()))
          return { text: `ran /${command}` }
        },
      },
      model: {
        fork: async ({ prompt }) => {
          session.forks.push(prompt)
          return { isAnswered: true, text: 'Fixing the login test.', usage: {} }
        },
      },
    }
  }

  // $.process.spawn: the pieces as they come, then how the child ended.
  // Like Claude Code's, the child's stdin is /dev/null and its stdout a pipe,
  // and leaving the loop (return(), a pull pending or not) ends the child:
  // SIGTERM, then SIGKILL 2 s later; its result is then undefined.
  #spawn({ argv, cwd, env }) {
    const child = spawn(argv[0], argv.slice(1), {
      cwd,
      env: { ...process.env, ...this.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    ;(argv.some(part => SETUP.test(part)) ? this.setups : this.children).push(child)
    const pieces = []
    let wake = () => {}
    let end
    let failure
    let left = false
    const push = piece => {
      pieces.push(piece)
      wake()
    }
    child.stdout.setEncoding('utf8').on('data', text => push({ stream: 'stdout', text }))
    child.stderr.setEncoding('utf8').on('data', text => push({ stream: 'stderr', text }))
    child.on('error', err => ((failure = err), wake()))
    child.on('close', (code, signal) => ((end = { code, signal }), wake()))
    let settle
    const result = new Promise(resolve => (settle = resolve))
    return {
      [Symbol.asyncIterator]() {
        return this
      },
      async next() {
        for (;;) {
          if (left) return { done: true, value: undefined }
          if (pieces.length > 0) return { done: false, value: pieces.shift() }
          if (failure) throw failure
          if (end) return settle(end), { done: true, value: end }
          await new Promise(resolve => (wake = resolve))
        }
      },
      async return() {
        if (!left && !end) {
          child.kill('SIGTERM')
          const kill = setTimeout(() => child.kill('SIGKILL'), 2000)
          child.once('close', () => clearTimeout(kill))
        }
        left = true
        settle(undefined)
        wake()
        return { done: true, value: undefined }
      },
      result,
    }
  }
}

let session
let runDir
let send
// Every lich and session started, for the end.
const started = []

// A development lich, a session of the relay inside it, started with its
// own run folder; send(command) queues one command in that lich and
// resolves with what lich got back for it.
async function inLich(sessionId) {
  const lich = spawn(PYTHON, ['-c', LICH], {
    env: { ...process.env, PYTHONPATH: [ROOT, join(ROOT, 'tests')].join(delimiter), LICH_TOKEN: TOKEN, LICH_SESSION_ID: sessionId },
    // Its stderr through a pipe, not inherited: Windows Python under Wine
    // dies at start on a stderr that is a Linux file.
    stdio: ['pipe', 'pipe', 'pipe'],
  })
  lich.stderr.pipe(process.stderr)
  const replies = createInterface({ input: lich.stdout })[Symbol.asyncIterator]()
  const port = (await replies.next()).value
  const runDir = DEFAULT_RUN_DIR ? undefined : mkdtempSync(join(tmpdir(), 'lcr-'))
  const session = new FakeSession({
    LICH_PORT: port,
    LICH_TOKEN: TOKEN,
    LICH_SESSION_ID: sessionId,
    ...(runDir && { LICH_CONTROL_RUN_DIR: runDir }),
  })
  started.push({ lich, session, runDir })
  await session.load()
  await session.fire('session.start', { cwd: ROOT, surface: 'terminal', isInteractive: true }, { cwd: ROOT })
  const send = async command => {
    lich.stdin.write(JSON.stringify(command) + '\n')
    return JSON.parse((await replies.next()).value)
  }
  return { session, runDir, send }
}

before(async () => {
  ;({ session, runDir, send } = await inLich(SESSION))
})

after(async () => {
  for (const { lich, session, runDir } of started) {
    for (const child of [...session.setups, ...session.children]) if (child.exitCode === null) child.kill('SIGTERM')
    lich.kill('SIGTERM')
    if (runDir) rmSync(runDir, { recursive: true, force: true })
  }
})

test('commands from lich reach the session through the daemon and the relay, and are acked', { timeout: 60_000 }, async t => {
  await t.test('a prompt starts a turn and is acked once it started', async () => {
    const { ack, plugin } = await send({ id: 'm1', kind: 'prompt', text: 'run the tests' })
    assert.deepEqual(ack, { session_id: SESSION, id: 'm1', kind: 'prompt', ok: true })
    assert.equal(plugin, CONTRACT_RELEASE, 'the X-Lich-Plugin the daemon sent')
    assert.deepEqual(session.prompts, [{ text: 'run the tests' }])
    assert.equal(session.running, 't1')
    // Where the daemon said it listens: a Unix socket, or on Windows loopback
    // TCP, every post there with the daemon's secret.
    const [post] = session.fetched
    if (WINDOWS) {
      assert.match(post.url, /^http:\/\/127\.0\.0\.1:\d+\/v1\//)
      assert.equal(post.socketPath, undefined)
      assert.ok(post.secret && session.fetched.every(other => other.secret === post.secret), 'every post carries the secret')
    } else {
      assert.ok(post.socketPath && post.secret === undefined, JSON.stringify(post))
    }
  })

  await t.test('an abort ends the running turn and is acked', async () => {
    const { ack } = await send({ id: 'm2', kind: 'abort' })
    assert.deepEqual(ack, { session_id: SESSION, id: 'm2', kind: 'abort', ok: true })
    assert.equal(session.running, null)
  })

  await t.test('an ask forks with the question last and is acked with the answer', async () => {
    const { ack } = await send({ id: 'm3', kind: 'ask', question: ASK })
    assert.deepEqual(ack, { session_id: SESSION, id: 'm3', kind: 'ask', ok: true, answer: 'Fixing the login test.' })
    assert.equal(session.forks.length, 1)
    assert.ok(session.forks[0].trimEnd().endsWith(ASK), session.forks[0])
    assert.ok(session.forks[0].length > ASK.length, 'the question goes behind a preamble')
  })

  await t.test('a model override is acked and applied to the next request', async () => {
    const { ack } = await send({ id: 'm4', kind: 'model', model: 'claude-opus-4-1' })
    assert.deepEqual(ack, { session_id: SESSION, id: 'm4', kind: 'model', ok: true })
    await session.step({ turnId: 't2', index: 0, model: 'claude-sonnet-4-5', effort: 'medium', messageCount: 1 })
    assert.deepEqual(session.steps.at(-1), {
      turnId: 't2',
      index: 0,
      model: 'claude-opus-4-1',
      effort: 'medium',
      messageCount: 1,
    })
  })

  // Windows will not delete a file a process holds open: the daemon's lock
  // file, and with it the run folder, stay while it runs.
  if (WINDOWS) {
    await t.test('the run folder cannot be removed under the daemon: its lock file is refused, and the command in flight is acked', async () => {
      const held = new Promise(begun => (session.begun = begun))
      const acked = send({ id: 'm5', kind: 'command', name: 'hold' })
      await held
      assert.throws(() => unlinkSync(join(runDir, `${SESSION}.lock`)), { code: 'EBUSY' })
      session.release()
      const { ack } = await acked
      assert.deepEqual(ack, { session_id: SESSION, id: 'm5', kind: 'command', ok: true })
      assert.equal(session.children.length, 1)
    })
  }

  // systemd-logind removes $XDG_RUNTIME_DIR at the user's last logout, and
  // lich may run on in tmux: the relay's posts would find no socket.
  if (!WINDOWS) await t.test('the run folder removed under the daemon: what is in flight is acked with why, and a new daemon takes the next command', async () => {
    const [first] = session.children
    const exited = once(first, 'exit')
    const held = new Promise(begun => (session.begun = begun))
    const acked = send({ id: 'm5', kind: 'command', name: 'hold' })
    await held
    // The daemon's own choice: the folder of the socket it named.
    rmSync(runDir ?? dirname(session.fetched[0].socketPath), { recursive: true, force: true })
    const { ack } = await acked
    assert.deepEqual(ack, {
      session_id: SESSION, id: 'm5', kind: 'command', ok: false,
      error: 'the daemon stopped before the session answered (its socket was removed (the run folder deleted under it?); starting again on a new one)',
    })
    assert.deepEqual(await exited, [1, null])
    session.release()
    const next = await send({ id: 'm6', kind: 'model', model: 'claude-opus-4-1' })
    assert.deepEqual(next.ack, { session_id: SESSION, id: 'm6', kind: 'model', ok: true })
    assert.equal(session.children.length, 2)
  })

  // What Claude Code does when the session ends: a 0 tells the relay not to
  // start it again. Windows has no SIGTERM: Node's kill() there ends the
  // daemon outright (TerminateProcess), and the daemon's exit code is 1.
  await t.test(WINDOWS ? 'the daemon is ended outright by kill()' : 'the daemon stops on SIGTERM with 0', async () => {
    const child = session.children.at(-1)
    const exited = once(child, 'exit')
    child.kill('SIGTERM')
    const [code, signal] = await exited
    if (WINDOWS) assert.ok(code !== 0 || signal === 'SIGTERM', `${code} ${signal}`)
    else assert.deepEqual([code, signal], [0, null])
  })

  await t.test('the daemon\'s secret is in no log line', () => {
    const secrets = new Set(session.fetched.map(post => post.secret).filter(Boolean))
    assert.equal(secrets.size > 0, WINDOWS)
    for (const secret of secrets) for (const line of session.logs) assert.ok(!line.includes(secret), line)
  })

  await t.test('the token is in no log line and no argument', () => {
    assert.ok(session.logs.length > 0, 'the relay logged the daemon')
    for (const line of session.logs) assert.ok(!line.includes(TOKEN), line)
    for (const child of session.children) assert.ok(!child.spawnargs.join(' ').includes(TOKEN))
  })
})

// Claude Code 2.1.280 to 2.1.287 refuses the relay's posts once
// CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set, also mid-session, in
// the settings' env. Windows has no SIGTERM: there the daemon is ended
// outright, and lich settles what it held as for any daemon gone.
if (!WINDOWS) test('where Claude Code starts refusing the relay\'s posts, the daemon is ended, acks the command it held with why, and is not started again', { timeout: 60_000 }, async () => {
  const { session, send } = await inLich('card-refused')
  const held = new Promise(begun => (session.begun = begun))
  const acked = send({ id: 'r1', kind: 'command', name: 'hold' })
  await held
  const [daemon] = session.children
  const exited = once(daemon, 'exit')
  const shown = new Promise(show => (session.shown = show))
  session.refusal = 'nonessential network traffic is disabled for this session'
  session.release()
  const { ack } = await acked
  assert.deepEqual(ack, {
    session_id: 'card-refused', id: 'r1', kind: 'command', ok: false,
    error: 'the daemon stopped before the session answered (got SIGTERM)',
  })
  assert.deepEqual(await exited, [0, null])
  // Shown once the relay is done with the daemon for good.
  assert.equal(await shown, 'no lich control while CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set: unset it or update Claude Code to 2.1.288+, then restart claude')
  assert.equal(session.children.length, 1)
})
