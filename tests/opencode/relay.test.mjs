// The opencode relay's logic (hooks/opencode/lich-control.js) under Node's
// own test runner, with nothing installed: a fake opencode `client` that
// records every call, a fake daemon whose stdout the test writes, and the
// socket posts recorded instead of sent. The live test (live_opencode.py)
// runs the same relay inside a real opencode against the real daemon.
//
//   node --test tests/opencode/
import assert from 'node:assert/strict'
import { EventEmitter } from 'node:events'
import { dirname, join, resolve } from 'node:path'
import { PassThrough } from 'node:stream'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import lichControl, { Relay, insideLich, plugin } from '../../hooks/opencode/lich-control.js'
import { forkReply } from '../../hooks/opencode/relay/calls.js'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..')
const SOCKET = '/run/lich-control/oc1.sock'
const TUI = { argv: ['bun', '/$bunfs/root/src/cli/tui/worker.js'], isMainThread: false }
const LICH = { LICH_PORT: '4312', LICH_TOKEN: 'tok', LICH_SESSION_ID: 'oc1' }
const PROVIDERS = [
  { id: 'fake', models: { m1: { variants: { low: {}, medium: {}, high: { reasoningEffort: 'high' } } }, m2: { variants: { high: {} } } } },
  { id: 'other', models: { m2: { variants: {} } } },
]

// opencode's in-process client as the relay uses it: each method answers
// from `answers` (or with `{}`), and every call is kept in `calls`.
function fakeClient(answers = {}) {
  const calls = []
  const method = name => async (options) => {
    calls.push({ name, options })
    const answer = answers[name]
    const value = typeof answer === 'function' ? await answer(options) : answer
    return value !== null && typeof value === 'object' && ('error' in value || 'data' in value) ? value : { data: value ?? {} }
  }
  const client = { calls }
  for (const name of ['session.create', 'session.promptAsync', 'session.status', 'session.abort', 'session.command', 'session.fork',
    'session.prompt', 'session.delete', 'session.get', 'command.list', 'config.providers', 'config.get', 'tui.publish', 'app.log']) {
    const [group, call] = name.split('.')
    client[group] ??= {}
    client[group][call] = method(name)
  }
  client.named = name => calls.filter(c => c.name === name)
  return client
}

// A daemon that never runs: the test writes its stdout and ends it.
class FakeDaemon extends EventEmitter {
  pid = 4242
  stdout = new PassThrough()
  stderr = new PassThrough()
  killed = []
  say(message) {
    this.stdout.write(JSON.stringify(message) + '\n')
  }
  exit(code) {
    this.stdout.end()
    this.stderr.end()
    setImmediate(() => this.emit('close', code, null))
  }
  kill(signal) {
    this.killed.push(signal)
    this.exit(null)
  }
}

// hooks/lich_runtime.py as the relay runs it: its steps on stderr, its result on stdout.
class FakeSetup extends FakeDaemon {
  constructor(result, steps = []) {
    super()
    setImmediate(() => {
      for (const step of steps) this.stderr.write(`${step}\n`)
      this.stdout.write(`${JSON.stringify(result)}\n`)
      this.exit(result.ok ? 0 : 1)
    })
  }
}

// A relay on a fake client and fake processes, its posts and sleeps recorded,
// its daemon connected on SOCKET. `python` null: no interpreter named, so the
// relay runs the setup, which answers `setup` (by default: ready,
// /data/env/bin/python).
function world(answers = {}, options = {}) {
  const client = fakeClient(answers)
  const daemons = []
  const spawned = []
  const posts = []
  const sleeps = []
  let failing = options.failPosts ?? 0 // the next posts that fail on the way
  let holding = options.holdPosts ?? false // posts wait for answerPosts(n), until releasePosts()
  const held = []
  const relay = new Relay({
    client,
    python: options.python === undefined ? '/venv/bin/python' : options.python,
    data: '/data/opencode/lich-control',
    platform: options.platform ?? 'linux',
    spawn: (command, args, spawnOptions) => {
      spawned.push({ command, args, cwd: spawnOptions.cwd, env: spawnOptions.env })
      if (options.missing?.includes(command)) throw Object.assign(new Error(`spawn ${command} ENOENT`), { code: 'ENOENT' })
      if (args.some(arg => String(arg).endsWith('lich_runtime.py'))) {
        return new FakeSetup(options.setup ?? { ok: true, python: '/data/env/bin/python', built: true }, options.steps)
      }
      const daemon = new FakeDaemon()
      if (options.spawnFails) daemon.pid = undefined
      daemons.push(daemon)
      return daemon
    },
    post: async (address, path, body) => {
      posts.push({ socketPath: address.socket, address, path, body })
      if (holding) await new Promise(answer => held.push(answer))
      if (failing > 0) {
        failing -= 1
        throw new Error('socket hang up')
      }
      return { status: 204, text: '' }
    },
    sleep: ms => new Promise(wake => sleeps.push({ ms, wake })),
    now: () => options.clock?.() ?? 0,
    abortSettleMs: 50,
    ...(options.realSocket && { post: undefined, sleep: undefined, now: undefined }),
  })
  const hooks = relay.hooks()
  relay.start()
  const w = {
    client, relay, hooks, daemons, spawned, posts, sleeps,
    daemon: () => daemons.at(-1),
    answerPosts: n => {
      for (const answer of held.splice(0, n)) answer()
    },
    releasePosts: () => {
      holding = false
      w.answerPosts(held.length)
    },
    hello: (socket = SOCKET) => w.daemon().say({ op: 'hello', protocol: 1, pid: 7, socket, version: '0.1.0' }),
    call: (id, method, args) => w.daemon().say({ op: 'call', id, method, args }),
    // Resolves with the posted result of call `id`.
    result: id => until(() => posts.find(p => p.path === '/v1/result' && p.body.id === id)?.body),
    events: () => posts.filter(p => p.path === '/v1/event').map(p => `${p.body.event} ${p.body.turnId}`),
    // What the relay logged, in order.
    logs: () => client.named('app.log').map(c => c.options.body.message),
    bus: (type, properties) => hooks.event({ event: { type, properties } }),
    status: (sessionID, type) => w.bus('session.status', { sessionID, status: { type } }),
    created: (id, parentID) => w.bus('session.created', { sessionID: id, info: { id, ...(parentID && { parentID }) } }),
    prompted: async (sessionID, model = { providerID: 'fake', modelID: 'm1' }) => {
      const output = { message: { id: 'msg', sessionID, role: 'user', model: { ...model } }, parts: [] }
      await hooks['chat.message']({ sessionID }, output)
      return output.message
    },
    // Prompted, so lich drives it, and busy: a turn of it runs (o1, the first).
    startTurn: async sessionID => {
      await w.prompted(sessionID)
      w.status(sessionID, 'busy')
    },
  }
  // A daemon from a named interpreter is there at once, and says hello unless told not to.
  if (options.python !== null && options.hello !== false) w.hello()
  return w
}

async function until(check, ms = 2000) {
  const deadline = Date.now() + ms
  for (;;) {
    const value = check()
    if (value) return value
    assert.ok(Date.now() < deadline, 'what the test waited for never came')
    await new Promise(wake => setTimeout(wake, 1))
  }
}

const flush = () => new Promise(wake => setImmediate(wake))

// -- the gate -------------------------------------------------------------

test('the gate opens only with all three variables in the interactive TUI', () => {
  assert.equal(insideLich({ env: LICH, ...TUI }), true)
  for (const name of Object.keys(LICH)) {
    assert.equal(insideLich({ env: { ...LICH, [name]: '' }, ...TUI }), false, `${name} empty`)
  }
  // `opencode run` and `opencode serve` run the server on the main thread.
  assert.equal(insideLich({ env: LICH, argv: ['bun', '/$bunfs/root/src/index.js', 'run', 'hi'], isMainThread: true }), false)
  assert.equal(insideLich({ env: LICH, argv: TUI.argv, isMainThread: true }), false)
})

test('outside the TUI the plugin starts nothing; inside it, on Linux and Windows alike, the relay', async () => {
  assert.equal(lichControl.id, 'lich-control')
  assert.deepEqual(await lichControl.server({ client: fakeClient() }, {}), {})
  // An interpreter that is not there: the relay runs nothing.
  const options = { python: '/nonexistent/python' }
  for (const platform of ['linux', 'win32']) {
    const hooks = await plugin({ client: fakeClient() }, options, { env: LICH, ...TUI, platform })
    assert.equal(typeof hooks['chat.message'], 'function', platform)
    await hooks.dispose()
  }
})

// -- the daemon -----------------------------------------------------------

test('the daemon runs with the interpreter the python option names, nothing set up; dispose ends it for good', async () => {
  const w = world()
  assert.deepEqual(w.spawned.map(s => [s.command, ...s.args]), [['/venv/bin/python', '-m', 'lich_control', '--host', 'opencode']])
  assert.equal(w.spawned[0].cwd, ROOT)
  // opencode's environment, and opencode's own pid named as the daemon's parent.
  assert.deepEqual(w.spawned[0].env, { ...process.env, LICH_CONTROL_PARENT_PID: String(process.pid) })
  await w.hooks.dispose()
  assert.deepEqual(w.daemon().killed, ['SIGTERM'])
  await flush()
  assert.equal(w.daemons.length, 1)
  assert.deepEqual(w.sleeps, [])
})

test('with no interpreter named, the shared setup builds one and the daemon runs from it', async () => {
  const w = world({}, { python: null, steps: ['creating a virtual environment in /data/env'] })
  await until(() => w.daemons.length === 1)
  assert.deepEqual(w.spawned.map(s => [s.command, ...s.args]), [
    ['python3', join(ROOT, 'hooks', 'lich_runtime.py'), '--data', '/data/opencode/lich-control'],
    ['/data/env/bin/python', '-m', 'lich_control', '--host', 'opencode'],
  ])
  assert.deepEqual(w.logs(), ['lich-control: setup: creating a virtual environment in /data/env'])
  const shell = { env: {} }
  await w.hooks['shell.env']({ cwd: '/work' }, shell)
  assert.deepEqual(shell.env, { LICH_CONTROL_PYTHON: '/data/env/bin/python' })
})

test('a setup that fails is logged in its one line, and no daemon starts', async () => {
  const error = 'lich-control cannot set up its Python environment: the package index could not be reached. Set the plugin\'s python option'
  const w = world({}, { python: null, setup: { ok: false, error } })
  await until(() => w.logs().length === 1)
  await flush()
  assert.deepEqual(w.logs(), [error])
  assert.equal(w.spawned.length, 1)
  // The hooks still answer, and change nothing.
  const output = { options: { keep: 1 } }
  await w.hooks['chat.params']({ agent: 'build', model: {} }, output)
  assert.deepEqual(output.options, { keep: 1 })
})

test('a setup that ends without a result is logged in the words the Claude Code relay uses, and no daemon starts', async () => {
  const w = world({}, { python: null, setup: { ok: false } })
  await until(() => w.logs().length === 1)
  await flush()
  assert.deepEqual(w.logs(), ["lich-control cannot set up its Python environment: hooks/lich_runtime.py exited with 1 without a result (the lines above say why). Set the plugin's python option to an interpreter that has lich-control installed (docs/opencode.md)"])
  assert.equal(w.spawned.length, 1)
})

test('a post that fails on the way is sent again after a pause, twice; only the third failure is logged', async () => {
  const w = world({}, { failPosts: 3 })
  w.call('c1', 'overrides.set', { model: null, effort: null })
  for (let sent = 1; sent <= 2; sent++) {
    await until(() => w.sleeps.length === sent)
    // Not sent again before the pause is over, and not given up on.
    assert.equal(w.posts.length, sent)
    assert.equal(w.sleeps.at(-1).ms, 250)
    assert.equal(w.logs().some(m => m.includes('could not be reached')), false)
    w.sleeps.at(-1).wake()
  }
  await until(() => w.logs().some(m => m.includes('could not be reached for /v1/result: socket hang up')))
  assert.deepEqual(w.posts.map(p => p.body), Array(3).fill({ id: 'c1', ok: true, value: null }))
})

test('no more than eight posts are on their way at once; the rest wait their turn in order', async () => {
  const w = world({}, { holdPosts: true })
  for (let i = 0; i < 20; i++) w.call(`c${i}`, 'overrides.set', { model: null, effort: null })
  await until(() => w.posts.length === 8)
  await flush()
  assert.equal(w.posts.length, 8)
  w.answerPosts(3)
  await until(() => w.posts.length === 11)
  await flush()
  assert.equal(w.posts.length, 11)
  w.releasePosts()
  await until(() => w.posts.length === 20)
  assert.deepEqual(w.posts.map(p => p.body.id), Array.from({ length: 20 }, (_, i) => `c${i}`))
})

// -- the daemon's life: bridge.js's rules, which the Claude Code relay shares --

test('a daemon that exits 1 is restarted after a growing delay, five times at most; a restart hears of the running turn', async () => {
  const w = world()
  await w.startTurn('ses_a')
  await until(() => w.posts.length > 0)
  for (let restart = 1; restart <= 5; restart++) {
    w.daemon().exit(1)
    await until(() => w.sleeps.length === restart)
    assert.equal(w.sleeps.at(-1).ms, 1000 * 2 ** (restart - 1))
    // Not started again before the delay is over.
    await flush()
    assert.equal(w.daemons.length, restart)
    w.sleeps.at(-1).wake()
    await until(() => w.daemons.length === restart + 1)
    if (restart === 1) {
      w.hello('/run/lich-control/second.sock')
      await until(() => w.posts.some(p => p.socketPath.endsWith('second.sock')))
      assert.deepEqual(w.posts.filter(p => p.socketPath.endsWith('second.sock')).map(p => p.body), [{ event: 'turn.start', turnId: 'o1' }])
    }
  }
  w.daemon().exit(1)
  await until(() => w.logs().some(m => m.includes('exited with 1; not restarting it again')))
  assert.equal(w.sleeps.length, 5)
  assert.equal(w.daemons.length, 6)
})

test('a daemon that exits 0, or 2 (its configuration refused), is not restarted', async () => {
  for (const code of [0, 2]) {
    const w = world({}, { hello: false })
    w.daemon().exit(code)
    // No daemon will run again.
    await until(() => w.relay.bridge.daemon.value === null)
    assert.equal(w.daemons.length, 1)
    assert.deepEqual(w.sleeps, [])
    assert.deepEqual(w.logs(), code === 0 ? [] : ['lich-control: the daemon exited with 2: its configuration is wrong; not restarting it'])
  }
})

test('a daemon that finds the session held by another (exit 75) is started again after a pause for as long as that lasts, outside the budget', async () => {
  const w = world({}, { hello: false })
  for (let attempt = 1; attempt <= 8; attempt++) {
    w.daemon().exit(75)
    await until(() => w.sleeps.length === attempt)
    assert.equal(w.sleeps.at(-1).ms, 1000)
    w.sleeps.at(-1).wake()
    await until(() => w.daemons.length === attempt + 1)
  }
  assert.deepEqual(w.logs(), ['lich-control: the daemon exited with 75: another daemon still polls for this session; starting it again every few seconds until that one is gone'])
  // The budget is whole: a crash after it is the first of five restarts.
  w.daemon().exit(1)
  await until(() => w.logs().some(m => m.includes('exited with 1; restart 1 of 5 in 1000 ms')))
})

test('what a daemon that ended asked for dies with it; one that ran a healthy minute earns a fresh restart budget', async () => {
  let list
  let now = 0
  const answers = { 'command.list': () => new Promise(answer => (list = answer)), 'config.providers': { providers: PROVIDERS } }
  const w = world(answers, { clock: () => now })
  w.call('c1', 'overrides.set', { model: 'fake/m2', effort: null })
  await w.result('c1')
  w.call('c2', 'command.run', { command: 'word' })
  await until(() => list !== undefined)
  w.daemon().exit(1)
  await until(() => w.sleeps.length === 1)
  w.sleeps[0].wake()
  await until(() => w.daemons.length === 2)
  w.hello('/run/lich-control/second.sock')
  list([{ name: 'word' }])
  await until(() => w.logs().some(m => m.includes('c2 (command.run) has ended; its result is dropped')))
  assert.deepEqual(w.posts.map(p => p.body.id), ['c1'])
  assert.deepEqual((await w.prompted('ses_a')).model, { providerID: 'fake', modelID: 'm1' })
  now += 60_000
  w.daemon().exit(1)
  await until(() => w.sleeps.length === 2)
  assert.equal(w.sleeps[1].ms, 1000)
})

test('dispose before a daemon that could not start has said so signals nothing', async () => {
  // As Node's spawn answers for a missing interpreter: no pid, the error told later.
  const w = world({}, { spawnFails: true, hello: false })
  await w.hooks.dispose()
  assert.deepEqual(w.daemon().killed, [])
})

// -- the session lich drives, and its turns -------------------------------

// The TUI drops a select it is not yet listening for: it is told again.
test('before any prompt, lich gets a session of its own, shown in the TUI each second, twenty times', async () => {
  const w = world({ 'session.create': { id: 'ses_new' } })
  w.call('c1', 'prompt.submit', { text: 'run the tests' })
  w.call('c2', 'prompt.submit', { text: 'and then lint' })
  assert.equal((await w.result('c1')).ok, true)
  assert.equal((await w.result('c2')).ok, true)
  assert.equal(w.client.named('session.create').length, 1)
  assert.deepEqual(w.client.named('session.promptAsync').map(c => [c.options.path.id, c.options.body.parts[0].text]),
    [['ses_new', 'run the tests'], ['ses_new', 'and then lint']])
  for (let sent = 1; sent < 20; sent++) {
    await until(() => w.sleeps.length === sent)
    assert.equal(w.client.named('tui.publish').length, sent)
    assert.equal(w.sleeps.at(-1).ms, 1000)
    w.sleeps.at(-1).wake()
  }
  await until(() => w.client.named('tui.publish').length === 20)
  await flush()
  assert.equal(w.sleeps.length, 19)
  const select = { type: 'tui.session.select', properties: { sessionID: 'ses_new' } }
  assert.deepEqual(w.client.named('tui.publish').map(c => c.options.body), Array(20).fill(select))
})

test('once the person prompts another session, the TUI is left where they are', async () => {
  const w = world({ 'session.create': { id: 'ses_new' } })
  w.call('c1', 'prompt.submit', { text: 'run the tests' })
  await w.result('c1')
  await until(() => w.sleeps.length === 1)
  w.created('ses_mine')
  await w.prompted('ses_mine')
  w.sleeps[0].wake()
  await flush()
  await flush()
  assert.equal(w.client.named('tui.publish').length, 1)
  assert.equal(w.sleeps.length, 1)
})

test('a select opencode refuses is logged once and not sent again', async () => {
  const w = world({ 'session.create': { id: 'ses_new' }, 'tui.publish': { error: { data: { message: 'no TUI' } } } })
  w.call('c1', 'prompt.submit', { text: 'run the tests' })
  assert.equal((await w.result('c1')).ok, true)
  const told = () => w.logs().filter(m => m.includes('TUI'))
  await until(() => told().length === 1)
  await flush()
  assert.deepEqual(told(), ["lich-control: opencode's TUI could not be told to show lich's session ses_new: no TUI"])
  assert.equal(w.client.named('tui.publish').length, 1)
  assert.deepEqual(w.sleeps, [])
})

test('lich drives the root session last prompted; forks and child sessions never take it', async () => {
  const w = world({ 'session.get': ({ path }) => ({ id: path.id, parentID: path.id === 'ses_sub' ? 'ses_root' : undefined }) })
  w.created('ses_a')
  w.created('ses_b')
  w.created('ses_child', 'ses_b')
  await w.prompted('ses_a')
  await w.prompted('ses_b')
  await w.prompted('ses_child')
  // One the bus has not described is looked up, once.
  await w.prompted('ses_sub')
  assert.equal(w.relay.sessions.chosen, 'ses_b')
  w.call('c1', 'prompt.submit', { text: 'go on' })
  await w.result('c1')
  assert.equal(w.client.named('session.promptAsync')[0].options.path.id, 'ses_b')
  await w.prompted('ses_root')
  await w.prompted('ses_root')
  assert.equal(w.relay.sessions.chosen, 'ses_root')
  assert.equal(w.client.named('session.get').length, 2)
})

test('each busy to idle of the chosen session is one turn; other sessions make none, until one is prompted', async () => {
  const w = world()
  w.created('ses_a')
  w.created('ses_b')
  await w.startTurn('ses_a')
  w.status('ses_a', 'busy')
  w.status('ses_a', 'retry')
  w.status('ses_b', 'busy')
  w.status('ses_a', 'idle')
  w.status('ses_a', 'idle')
  w.status('ses_a', 'busy')
  // Another session prompted mid-turn: the old turn ends for lich.
  await w.prompted('ses_b')
  await until(() => w.events().length === 5)
  assert.deepEqual(w.events(), ['turn.start o1', 'turn.complete o1', 'turn.start o2', 'turn.complete o2', 'turn.start o3'])
})

// -- abort ----------------------------------------------------------------

test('abort stops the running turn and answers once the session is idle; one it does not follow is reported', async () => {
  let statuses = {}
  const w = world({ 'session.status': () => statuses, 'session.abort': true })
  await w.startTurn('ses_a')
  // Refused: a turn that is not the running one, and one opencode says is idle.
  w.call('c8', 'turn.abort', { turnId: 'o9' })
  w.call('c9', 'turn.abort', { turnId: 'o1' })
  assert.deepEqual(await w.result('c8'), { id: 'c8', ok: false, error: 'o9 is not the running turn' })
  assert.deepEqual(await w.result('c9'), { id: 'c9', ok: false, error: 'no turn is running' })
  statuses = { ses_a: { type: 'busy' } }
  w.call('c1', 'turn.abort', { turnId: 'o1' })
  await until(() => w.client.named('session.abort').length === 1)
  await flush()
  assert.equal(w.posts.some(p => p.body.id === 'c1'), false, 'answered before the session went idle')
  w.status('ses_a', 'idle')
  assert.deepEqual(await w.result('c1'), { id: 'c1', ok: true, value: null })
  assert.equal(w.client.named('session.abort')[0].options.path.id, 'ses_a')
  // The next turn, o2, is still busy when its settle time (the second sleep) is over.
  w.status('ses_a', 'busy')
  w.call('c2', 'turn.abort', { turnId: 'o2' })
  await until(() => w.sleeps.length === 2)
  w.sleeps[1].wake()
  assert.match((await w.result('c2')).error, /o2, but its session was still busy 0.05 s later/)
})

// -- commands -------------------------------------------------------------

test('a command waits for the running turn to end, then runs in the driven session', async () => {
  const w = world({ 'command.list': [{ name: 'init' }, { name: 'word' }] })
  await w.startTurn('ses_a')
  w.call('c1', 'command.run', { command: 'word', args: 'apple' })
  await until(() => w.client.named('command.list').length === 1)
  await flush()
  assert.equal(w.client.named('session.command').length, 0)
  w.status('ses_a', 'idle')
  assert.deepEqual(await w.result('c1'), { id: 'c1', ok: true, value: null })
  assert.deepEqual(w.client.named('session.command')[0].options, { path: { id: 'ses_a' }, body: { command: 'word', arguments: 'apple' } })
})

// -- asks -----------------------------------------------------------------

test('an ask forks the driven session, prompts the fork with tools off, answers and deletes the fork', async () => {
  let w
  w = world({
    'session.fork': { id: 'ses_fork' },
    // The fork being prompted does not become the driven session.
    'session.prompt': async () => {
      w.created('ses_fork')
      await w.prompted('ses_fork')
      return { info: { role: 'assistant' }, parts: [{ type: 'step-start' }, { type: 'text', text: 'I am ' }, { type: 'text', text: 'testing' }] }
    },
    'session.delete': true,
  })
  // Before any session there is nothing to fork.
  w.call('c0', 'model.fork', { prompt: 'q' })
  assert.deepEqual((await w.result('c0')).value, { isAnswered: false, reason: 'nothing-to-fork' })
  await w.startTurn('ses_a')
  w.call('c1', 'model.fork', { prompt: '<preamble>Question: what now?' })
  assert.deepEqual(await w.result('c1'), { id: 'c1', ok: true, value: { isAnswered: true, text: 'I am testing' } })
  assert.deepEqual(w.client.named('session.fork')[0].options.path, { id: 'ses_a' })
  assert.deepEqual(w.client.named('session.prompt')[0].options, {
    path: { id: 'ses_fork' },
    body: { tools: { '*': false }, parts: [{ type: 'text', text: '<preamble>Question: what now?' }] },
  })
  assert.deepEqual(w.client.named('session.delete')[0].options.path, { id: 'ses_fork' })
  assert.equal(w.client.named('session.abort').length + w.client.named('session.promptAsync').length, 0)
  assert.equal(w.relay.sessions.chosen, 'ses_a')
})

test('a fork whose prompt fails is still deleted', async () => {
  const w = world({ 'session.fork': { id: 'ses_fork' }, 'session.prompt': { error: { data: { message: 'boom' } } } })
  await w.prompted('ses_a')
  w.call('c1', 'model.fork', { prompt: 'q' })
  assert.deepEqual(await w.result('c1'), { id: 'c1', ok: false, error: 'opencode could not answer in the fork: boom' })
  assert.deepEqual(w.client.named('session.delete')[0].options.path, { id: 'ses_fork' })
})

test("the fork's reply reads as $.model.fork's: aborted, api-error, empty-reply", () => {
  assert.deepEqual(forkReply({ info: { error: { name: 'MessageAbortedError', data: {} } }, parts: [] }), { isAnswered: false, reason: 'aborted' })
  assert.deepEqual(forkReply({ info: { error: { name: 'APIError', data: { statusCode: 529, message: 'overloaded' } } } }),
    { isAnswered: false, reason: 'api-error', status: 529, error: 'APIError' })
  assert.deepEqual(forkReply({ info: {}, parts: [{ type: 'text', text: '  ' }, { type: 'text', text: 'hidden', synthetic: true }] }),
    { isAnswered: false, reason: 'empty-reply' })
})

// -- overrides ------------------------------------------------------------

test('a model override is checked against opencode and changes the model from the next prompt on', async () => {
  const w = world({ 'config.providers': { providers: PROVIDERS } })
  w.call('c1', 'overrides.set', { model: 'fake/m2', effort: null })
  assert.equal((await w.result('c1')).ok, true)
  assert.deepEqual((await w.prompted('ses_a')).model, { providerID: 'fake', modelID: 'm2' })
  w.call('c2', 'overrides.set', { model: null, effort: null })
  await w.result('c2')
  assert.deepEqual((await w.prompted('ses_a')).model, { providerID: 'fake', modelID: 'm1' })
  // A model id only one provider has needs no provider named.
  w.call('c3', 'overrides.set', { model: 'm1', effort: null })
  assert.equal((await w.result('c3')).ok, true)
})

test('an effort override merges the model variant into every request but opencode own ones', async () => {
  const w = world({ 'config.providers': { providers: PROVIDERS } })
  await w.prompted('ses_a')
  w.call('c1', 'overrides.set', { model: null, effort: 'high' })
  assert.equal((await w.result('c1')).ok, true)
  const model = { id: 'm1', providerID: 'fake', variants: PROVIDERS[0].models.m1.variants }
  for (const [agent, expected] of [['build', { keep: 1, reasoningEffort: 'high' }], ['title', { keep: 1 }], ['compaction', { keep: 1 }]]) {
    const output = { temperature: 0, options: { keep: 1 } }
    await w.hooks['chat.params']({ sessionID: 'ses_a', agent, model, message: {} }, output)
    assert.deepEqual(output.options, expected, agent)
  }
})

// -- what the relay cannot do -------------------------------------------

test('a call the relay or opencode cannot carry out is refused, saying why', async () => {
  const w = world({
    'command.list': [{ name: 'init' }, { name: 'review' }],
    'session.command': { error: { name: 'UnknownError', data: { message: 'the template failed' } } },
    'config.providers': { providers: PROVIDERS },
    'config.get': { model: 'fake/m1' },
  })
  await w.prompted('ses_a')
  const cases = [
    ['turn.rewind', {}, 'this relay has no method turn.rewind'],
    ['command.run', { command: 'compact' }, 'opencode has no command /compact that its API can run (it has: init, review)'],
    ['command.run', { command: 'review' }, 'opencode could not run /review: the template failed'],
    ['overrides.set', { model: 'fake/m9', effort: null }, 'opencode has no model fake/m9 (name it as provider/model; `opencode models` lists them)'],
    ['overrides.set', { model: 'm2', effort: null }, 'more than one opencode provider has a model m2: name it as fake/m2 or other/m2'],
    ['overrides.set', { model: null, effort: 'max' }, 'fake/m1 has no max effort in opencode (its levels: low, medium, high)'],
    ['overrides.set', { model: 'fake/m2', effort: 'low' }, 'fake/m2 has no low effort in opencode (its levels: high)'],
  ]
  cases.forEach(([method, args], i) => w.call(`c${i}`, method, args))
  for (const [i, [method, , error]] of cases.entries()) {
    assert.deepEqual(await w.result(`c${i}`), { id: `c${i}`, ok: false, error }, method)
  }
})

// -- a burst of results ---------------------------------------------------

// The daemon's socket as the relay meets it: HTTP on a Unix socket that
// answers 204 to each post and keeps every result's id, with a small listen
// backlog, so connections opened faster than it accepts them are refused as
// a full backlog refuses them (connect EAGAIN, or a reset mid-write).
async function resultSocket(backlog) {
  const { mkdtempSync, rmSync } = await import('node:fs')
  const { tmpdir } = await import('node:os')
  const { createServer } = await import('node:http')
  const folder = mkdtempSync(join(tmpdir(), 'lich-oc-burst-'))
  const path = join(folder, 'daemon.sock')
  const ids = new Set()
  const server = createServer((req, res) => {
    let text = ''
    req.setEncoding('utf8').on('data', chunk => (text += chunk)).on('end', () => {
      ids.add(JSON.parse(text).id)
      res.writeHead(204).end()
    })
  })
  await new Promise(ready => server.listen({ path, backlog }, ready))
  return {
    path,
    ids,
    close: () => new Promise(done => server.close(() => done(rmSync(folder, { recursive: true, force: true })))),
  }
}

test('a burst of 1,200 results settling at once reaches the daemon whole', async () => {
  const socket = await resultSocket(8)
  // The relay's own socket post and clock: only the client and the daemon's process are fakes.
  const w = world({}, { realSocket: true, hello: false })
  try {
    w.hello(socket.path)
    // One write, as a daemon whose asks all settled together writes them.
    w.daemon().stdout.write(Array.from({ length: 1200 }, (_, i) => JSON.stringify({ op: 'call', id: `c${i}`, method: 'overrides.set', args: {} })).join('\n') + '\n')
    const lost = () => w.logs().filter(m => m.includes('could not be reached'))
    await until(() => socket.ids.size === 1200 || lost().length > 0, 60_000)
    assert.deepEqual(lost().slice(0, 3), [], `${lost().length} results lost`)
  } finally {
    w.relay.stop()
    await socket.close()
  }
})

// -- Windows --------------------------------------------------------------

test('on Windows (win32) the setup runs with the py launcher, else with python on PATH, else one line names both', async () => {
  const launcher = world({}, { python: null, platform: 'win32' })
  await until(() => launcher.daemons.length === 1)
  assert.deepEqual(launcher.spawned[0].command, 'py')
  assert.deepEqual(launcher.spawned[0].args.slice(0, 1), ['-3'])

  const path = world({}, { python: null, platform: 'win32', missing: ['py'] })
  await until(() => path.daemons.length === 1)
  assert.deepEqual(path.spawned.map(s => s.command), ['py', 'python', '/data/env/bin/python'])

  const neither = world({}, { python: null, platform: 'win32', missing: ['py', 'python'] })
  await until(() => neither.logs().length === 1)
  assert.deepEqual(neither.logs(), ["lich-control cannot set up its Python environment: py -3 nor python did not run (py -3: spawn py ENOENT; python: spawn python ENOENT). Install Python 3.9 or later, or set the plugin's python option to an interpreter that has lich-control installed (docs/opencode.md)"])
  assert.equal(neither.daemons.length, 0)
})

// A Windows daemon's bridge as the relay meets it: HTTP on loopback TCP that
// answers 204 to a post carrying the secret, 403 to any other.
async function loopbackDaemon(secret) {
  const { createServer } = await import('node:http')
  const seen = []
  const server = createServer((req, res) => {
    let text = ''
    req.setEncoding('utf8').on('data', chunk => (text += chunk)).on('end', () => {
      const allowed = req.headers['x-lich-control-secret'] === secret
      seen.push({ path: req.url, allowed, body: JSON.parse(text) })
      res.writeHead(allowed ? 204 : 403).end(allowed ? undefined : 'the bridge\'s secret is missing or wrong\n')
    })
  })
  await new Promise(ready => server.listen({ host: '127.0.0.1', port: 0 }, ready))
  return { port: server.address().port, seen, close: () => new Promise(done => server.close(done)) }
}

test('a hello with a port and a secret (a Windows daemon, lines ended \\r\\n): posts go to that port carrying the secret, which no log line holds', async () => {
  const SECRET = 'bridge-secret-7c1e'
  const daemon = await loopbackDaemon(SECRET)
  const w = world({}, { realSocket: true, hello: false })
  try {
    w.daemon().stdout.write(JSON.stringify({ op: 'hello', protocol: 1, pid: 7, port: daemon.port, secret: SECRET, version: '0.1.0' }) + '\r\n')
    w.daemon().stdout.write(JSON.stringify({ op: 'call', id: 'c1', method: 'overrides.set', args: { model: null, effort: 'high' } }) + '\r\n')
    await until(() => daemon.seen.length === 1)
    assert.deepEqual(daemon.seen, [{ path: '/v1/result', allowed: true, body: { id: 'c1', ok: true, value: null } }])
    assert.ok(w.logs().includes(`lich-control: the daemon 7 (0.1.0, protocol 1) listens on 127.0.0.1:${daemon.port}`), w.logs().join('\n'))
    assert.deepEqual(w.logs().filter(m => m.includes(SECRET)), [])
  } finally {
    w.relay.stop()
    await daemon.close()
  }
})
