// The relay inside the real engine: the test stands beneath it as the host
// (the daemon's process, its socket, the $ calls) and checks what crosses.
import type { On } from 'claude-code'
import { describe, expect, test, type Engine } from 'claude-code/testing'
import { Child, DATA, ENV_PYTHON, LICH, SETUP, World, answered, step } from './world.ts'

const INTERACTIVE = { cwd: '/home/me/project', surface: 'terminal', isInteractive: true } as const
const PROBLEM = 'pip: the package index could not be reached'
const RETRY = `/usr/bin/python3 /plugin/hooks/lich_runtime.py --data ${DATA}`
const FAILURE = `lich-control cannot set up its Python environment: ${PROBLEM}. To try again: ${RETRY} (the next session tries again too). Or set the plugin's python option to an interpreter that has lich-control installed, or install it by hand (docs/install.md)`
// The line under the prompt while the setup builds.
const BUILDING = 'setting up Python for lich (first run)…'
// Why Claude Code 2.1.280 to 2.1.287 refuses every $.http.fetch while
// CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set, in its words, and the line
// under the prompt that says so.
const NONESSENTIAL = 'nonessential network traffic is disabled for this session'
const NO_CONTROL = 'no lich control while CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set: unset it or update Claude Code to 2.1.288+, then restart claude'

describe('the gate', () => {
  for (const name of Object.keys(LICH)) {
    for (const [how, env] of [
      ['unset', Object.fromEntries(Object.entries(LICH).filter(([key]) => key !== name))],
      ['empty', { ...LICH, [name]: '' }],
    ] as const) {
      test(`${name} ${how}: no daemon, and nothing on screen`, async ($, on) => {
        const world = await started($, on, {}, env)
        await world.clock.settle()
        expect(world.children).toHaveLength(0)
        expect(world.statuses).toEqual([])
      })
    }
  }

  test('all three set in an interactive session: the daemon starts', async ($, on) => {
    const world = await spawnedWith($, on)
    const { argv, cwd, env } = world.child.request
    expect(argv).toEqual([ENV_PYTHON, '-m', 'lich_control'])
    // The plugin's folder, where lich_control is, not the session's.
    expect(cwd).toStartWith('/')
    expect(cwd).not.toBe(INTERACTIVE.cwd)
    // What a command hook gets, and the engine's pid named as the daemon's parent.
    expect(env).toEqual({ CLAUDE_PID: '77', CLAUDE_PLUGIN_DATA: DATA, LICH_CONTROL_PARENT_PID: '77' })
    // The token reaches the daemon through the inherited environment alone.
    expect(JSON.stringify(world.child.request)).not.toContain(LICH.LICH_TOKEN)
    // Its environment was ready: nothing to show (the line an earlier load
    // of the module may have left is taken away, which shows nothing).
    world.child.hello('/s1')
    await world.clock.settle()
    expect(world.statuses).toEqual([undefined])
  })

  test('with no hook variables to read, the daemon is named no parent and finds its own', async ($, on) => {
    const world = await spawnedWith($, on, { hookEnv: undefined })
    expect(world.child.request.env).toBeUndefined()
  })

  test('a non-interactive run starts nothing, and shows nothing', async ($, on) => {
    const world = new World(on)
    await $.session.start({ cwd: '/home/me/project', surface: null, isInteractive: false })
    await world.clock.settle()
    expect(world.children).toHaveLength(0)
    expect(world.setups).toHaveLength(0)
    expect(world.statuses).toEqual([])
  })
})

describe('calls', () => {
  test('each bridge method is performed with its args and its result posted', async ($, on) => {
    const beneath: Record<string, unknown> = {}
    on('prompt.submit', ($, e) => {
      beneath.prompt = { text: e.text, origin: e.origin }
      return { text: e.text }
    })
    on('turn.abort', ($, e) => {
      beneath.abort = e
      return { value: undefined }
    })
    on('command.run', ($, e) => {
      beneath[`command ${e.command}`] = { command: e.command, args: e.args }
      return { text: `ran ${e.command}` }
    })
    on('model.fork', ($, e) => {
      beneath.fork = e
      return { value: { isAnswered: true, text: 'Fixing the login test.', usage: USAGE } }
    })
    const world = await connected($, on, '/run/lich-control/s1.sock')
    world.child.call('c7', 'prompt.submit', { text: 'run the tests' })
    world.child.call('c8', 'prompt.submit', { text: '<task-notification>…', asUser: true })
    world.child.call('c9', 'turn.abort', { turnId: 't1' })
    world.child.call('c10', 'command.run', { command: 'compact', args: 'keep the test plan' })
    world.child.call('c11', 'command.run', { command: 'clear' })
    world.child.call('c12', 'model.fork', { prompt: '<preamble>Question: what are you working on?' })
    await world.untilResults(6)

    expect(beneath.prompt).toEqual({
      text: '<task-notification>…',
      origin: { kind: 'plugin', name: 'lich-control', asUser: true },
    })
    expect(beneath.abort).toEqual({ turnId: 't1' })
    expect(beneath['command compact']).toEqual({ command: 'compact', args: 'keep the test plan' })
    expect(beneath['command clear']).toEqual({ command: 'clear', args: '' })
    expect(beneath.fork).toEqual({ prompt: '<preamble>Question: what are you working on?' })

    expect(byId(world.results())).toEqual({
      c7: { id: 'c7', ok: true, value: { text: 'run the tests' } },
      c8: { id: 'c8', ok: true, value: { text: '<task-notification>…' } },
      c9: { id: 'c9', ok: true, value: null },
      c10: { id: 'c10', ok: true, value: { text: 'ran compact' } },
      c11: { id: 'c11', ok: true, value: { text: 'ran clear' } },
      c12: { id: 'c12', ok: true, value: { isAnswered: true, text: 'Fixing the login test.', usage: USAGE } },
    })
    expect(world.posts.every(post => post.socket === '/run/lich-control/s1.sock')).toBe(true)
  })

  test('a prompt waiting for an idle session holds up no call behind it', async ($, on) => {
    let startTurn = () => {}
    on('prompt.submit', async ($, e) => {
      await new Promise<void>(resolve => (startTurn = resolve))
      return { text: e.text }
    })
    on('turn.abort', () => ({ value: undefined }))
    const world = await connected($, on)
    world.child.call('c1', 'prompt.submit', { text: 'run the tests' })
    world.child.call('c2', 'turn.abort', { turnId: 't0' })
    await world.untilResults(1)
    expect(world.results()).toEqual([{ id: 'c2', ok: true, value: null }])
    startTurn()
    await world.untilResults(2)
    expect(world.results()[1]).toEqual({ id: 'c1', ok: true, value: { text: 'run the tests' } })
  })

  // How a refusal becomes an error result is bridge.js's (the opencode suite).
  test('a refused call, or one the relay does not have, is posted as an error with its message', async ($, on) => {
    on('turn.abort', () => ({ deny: 't1 is not the running turn' }))
    const world = await connected($, on)
    world.child.call('c9', 'turn.abort', { turnId: 't1' })
    world.child.call('c13', 'session.rewind', {})
    await world.untilResults(2)
    expect(byId(world.results())).toEqual({
      c9: { id: 'c9', ok: false, error: expect.stringContaining('t1 is not the running turn') },
      c13: { id: 'c13', ok: false, error: 'this relay has no method session.rewind' },
    })
  })

  test('lines split across pieces, and pieces holding several, are read whole', async ($, on) => {
    const prompts: string[] = []
    on('prompt.submit', ($, e) => {
      prompts.push(e.text)
      return { text: e.text }
    })
    const world = await spawnedWith($, on)
    const hello = JSON.stringify({ op: 'hello', protocol: 1, pid: 1, socket: '/s1', version: '0.1.0' })
    const call = (id: string, text: string) =>
      JSON.stringify({ op: 'call', id, method: 'prompt.submit', args: { text } })
    world.child.write(hello.slice(0, 7))
    world.child.write(hello.slice(7, 30))
    world.child.write(hello.slice(30) + '\n' + call('a', 'one') + '\n' + call('b', 'two ✓').slice(0, 40))
    world.child.write('daemon: polling\n', 'stderr')
    world.child.write(call('b', 'two ✓').slice(40) + '\n' + call('c', 'three\nlines') + '\n')
    await world.untilResults(3)
    expect(prompts.sort()).toEqual(['one', 'three\nlines', 'two ✓'])
    // What the daemon says on stderr reaches the debug log, not the call reader.
    expect(world.logs).toContain('daemon: polling')
  })
})

describe('events', () => {
  test('turn events queued before the hello are posted after it, in hook order, one at a time', async ($, on) => {
    const world = await spawnedWith($, on)
    await $.turn.start({ text: 'go', turnId: 't1' })
    await $.turn.start({ text: 'look around', turnId: 't2', agentId: 'a1' })
    await $.turn.complete({ answer: '', durationMs: 5, isAborted: false, turnId: 't2', agentId: 'a1', reason: 'answer' })
    await $.turn.complete({ answer: 'done', durationMs: 9, isAborted: false, turnId: 't1', reason: 'answer' })
    await world.clock.settle()
    expect(world.posts).toHaveLength(0)

    // The first post is held: the next must wait for it, not race it.
    world.holdPath = '/v1/event'
    world.child.hello('/s1')
    await world.clock.settle()
    expect(world.posts).toHaveLength(0)
    world.release()
    await world.until(() => world.posts.length >= 3)
    await world.clock.settle()
    expect(world.posts.map(post => post.body)).toEqual([
      { event: 'turn.start', turnId: 't1' },
      { event: 'turn.complete', turnId: 't2' },
      { event: 'turn.complete', turnId: 't1' },
    ])
  })
})

describe('overrides', () => {
  test('applied to every turn.step from memory, and dropped by nulls', async ($, on) => {
    const world = await connected($, on)
    const set = async (id: string, args: object) => {
      world.child.call(id, 'overrides.set', args)
      await world.until(() => world.results().some(result => result.id === id))
      expect(world.results().find(result => result.id === id)).toEqual({ id, ok: true, value: null })
    }

    await drain($.turn.step(step(0)))
    await set('c1', { model: 'claude-opus-4-1', effort: null })
    await drain($.turn.step(step(1)))
    await drain($.turn.step(step(2, 't2')))
    await set('c2', { model: null, effort: 'high' })
    await drain($.turn.step(step(3)))
    await set('c3', { model: 'haiku', effort: 'max' })
    await drain($.turn.step({ ...step(4), agentId: 'a1' }))
    await set('c4', { model: null, effort: null })
    await drain($.turn.step(step(5)))

    expect(world.steps).toEqual([
      step(0),
      { ...step(1), model: 'claude-opus-4-1' },
      { ...step(2, 't2'), model: 'claude-opus-4-1' },
      { ...step(3), effort: 'high' },
      { ...step(4), agentId: 'a1', model: 'haiku', effort: 'max' },
      step(5),
    ])
  })

  test('the response streams through unchanged', async ($, on) => {
    const world = await spawnedWith($, on)
    world.respond = async function* (e) {
      yield { kind: 'text', index: 0, text: 'hel' }
      yield { kind: 'text', index: 0, text: 'lo' }
      return { ...answered(e), answer: 'hello' }
    }
    const stream = $.turn.step(step(0))
    const texts: string[] = []
    let read = await stream.next()
    for (; !read.done; read = await stream.next()) {
      if (read.value.kind === 'text') texts.push(read.value.text)
    }
    expect(texts).toEqual(['hel', 'lo'])
    expect(read.value.answer).toBe('hello')
  })
})

// The restart rules, and what a restarted daemon is sent, are bridge.js's,
// tested once in the opencode relay's suite; here, that the daemon's end
// reaches them and they run on $.clock.
describe('restarts', () => {
  test('a daemon that ends is restarted on Claude Code\'s clock', async ($, on) => {
    const world = await connected($, on)
    world.child.exit(null, 'SIGSEGV')
    await world.untilLogged('was ended by SIGSEGV; restart 1 of 5 in 1000 ms')
    await world.clock.advance(999)
    expect(world.children).toHaveLength(1)
    await world.clock.advance(1)
    await world.untilSpawned(2)
  })

  test('a daemon that cannot start counts as a crash', async ($, on) => {
    const world = await started($, on, { refuseSpawn: 'no such file: python3' })
    await world.untilLogged('restart 1 of 5 in 1000 ms')
    expect(world.logs.find(line => line.includes('restart 1'))).toContain('no such file: python3')
    await world.clock.advance(1000)
    await world.untilSpawned(2)
  })
})

// A daemon whose results Claude Code refuses to carry would take lich's
// commands and never ack them.
describe('where Claude Code refuses the relay\'s requests', () => {
  test('from the start (2.1.280 to 2.1.287 with nonessential traffic off): no setup, no daemon, and the cause and its mending in the debug log and in one row on screen', async ($, on) => {
    const world = await started($, on, { refuseFetch: NONESSENTIAL })
    await world.untilShown(NO_CONTROL)
    await world.clock.settle()
    expect(world.setups).toHaveLength(0)
    expect(world.children).toHaveLength(0)
    expect(world.statuses).toEqual([undefined, NO_CONTROL])
    expect(world.logs).toEqual([
      `lich-control runs no daemon, so lich cannot control this session: Claude Code refuses the plugin's requests to it (${NONESSENTIAL}); unset CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC or update Claude Code to 2.1.288 or later, then restart claude (docs/install.md, "Nonessential traffic, before 2.1.288")`,
    ])
  })

  test('for another cause, an organization\'s policy: said in Claude Code\'s words', async ($, on) => {
    const policy = 'Network access from plugins is disabled by your organization\'s policy. Contact your organization admin to enable it.'
    const world = await started($, on, { refuseFetch: policy })
    const line = `lich cannot control this session: Claude Code refuses the plugin's requests (${policy})`
    await world.untilShown(line)
    await world.clock.settle()
    expect(world.children).toHaveLength(0)
    expect(world.logs).toEqual([
      `lich-control runs no daemon, so lich cannot control this session: Claude Code refuses the plugin's requests to it (${policy}) (docs/install.md, "Nonessential traffic, before 2.1.288")`,
    ])
  })

  test('once the daemon runs (its env changed in the settings): the daemon is ended, so that it acks what it holds, and not started again; said the same way', async ($, on) => {
    const world = await connected($, on)
    world.refuseFetch = NONESSENTIAL
    world.child.call('c1', 'overrides.set', { model: 'claude-opus-4-1', effort: null })
    await world.untilShown(NO_CONTROL)
    expect(world.child.ended).toBe(true)
    expect(world.logs).toContain(`lich-control: the host refuses the relay's posts to the daemon (/v1/result: ${NONESSENTIAL}); ending the daemon, which acks what it holds, and starting none again`)
    // Past every restart's pause.
    await world.clock.advance(60_000)
    expect(world.children).toHaveLength(1)
    expect(world.posts).toEqual([])
  })
})

describe('the Python environment', () => {
  test('none yet: the setup script builds it once while the session goes on, then the daemon starts from it', async ($, on) => {
    const world = await started($, on, { holdSetup: true })
    await $.session.start(INTERACTIVE)
    await world.untilSetUp(1)
    const { argv, cwd, env } = world.setups[0].request
    // The system's python3 runs the script from the plugin's folder, with the
    // data folder Claude Code gives the plugin.
    expect(argv).toEqual(['python3', `${cwd}/${SETUP}`])
    expect(cwd).toStartWith('/')
    expect(env.CLAUDE_PLUGIN_DATA).toBe(DATA)

    // It says it builds: a line under the prompt says so, until the daemon is up.
    world.setups[0].building()
    await world.untilShown(BUILDING)

    // Turns go on while it builds.
    await drain($.turn.step(step(0)))
    expect(world.steps).toEqual([step(0)])
    await world.clock.settle()
    expect(world.children).toHaveLength(0)

    world.setups[0].ready(true)
    await world.untilSpawned(1)
    expect(world.statuses).toEqual([undefined, BUILDING])
    world.child.hello('/s1')
    await world.until(() => world.statuses.length === 3)
    expect(world.statuses).toEqual([undefined, BUILDING, undefined])
    expect(world.child.request.argv).toEqual([ENV_PYTHON, '-m', 'lich_control'])
    expect(world.logs).toContain(`lich-control setup: creating a virtual environment in ${DATA}/env-0.1.0-0123456789ab`)
    // The session's own commands (bin/ on its PATH) find the same interpreter.
    expect(world.envSet.LICH_CONTROL_PYTHON).toBe(ENV_PYTHON)
    // Two session.starts: one build, one daemon.
    await world.clock.settle()
    expect(world.setups).toHaveLength(1)
    expect(world.children).toHaveLength(1)
  })

  // However the setup ends badly: one line in the log that says why and what
  // to do, one on screen with its cause and what tries again, no daemon, and
  // nothing waits for a daemon that will not come.
  for (const [how, arrange, end, why, onScreen] of [
    ['a build that fails', { holdSetup: true }, (setup: Child) => (setup.building(), setup.failed(FAILURE, PROBLEM)),
      FAILURE, `cannot set up Python for lich: ${PROBLEM}. Mend that, then /reload-plugins`],
    ['no python3 to run the setup with', { refuseSetup: 'no such file: python3' }, undefined,
      'python3 did not run (lich-control: $.process.spawn: no such file: python3)',
      'cannot set up Python for lich: python3 did not run (lich-control: $.process.spawn: no such file: python3). Install Python 3.9 or later, then /reload-plugins'],
    ['a setup that ends without a result', { holdSetup: true }, (setup: Child) => setup.exit(1),
      `${SETUP} exited with 1 without a result`,
      `cannot set up Python for lich: ${SETUP} exited with 1 without a result (claude --debug logs its steps). /reload-plugins tries again`],
  ] as const) {
    test(`${how}: one line in the log, one on screen, and no daemon`, async ($, on) => {
      const world = await started($, on, arrange)
      if (end) await world.untilSetUp(1).then(() => end(world.setups[0]))
      await world.untilLogged('cannot set up')
      await $.turn.start({ text: 'go', turnId: 't1' })
      await world.clock.advance(2 * 3600_000)
      const lines = world.logs.filter(line => line.includes('cannot set up'))
      expect(lines).toEqual([expect.stringContaining(why)])
      expect(lines[0]).toContain("plugin's python option")
      expect(world.statuses[world.statuses.length - 1]).toBe(onScreen)
      expect(world.setups.length).toBeLessThanOrEqual(1)
      expect(world.children).toHaveLength(0)
      expect(world.posts).toHaveLength(0)
    })
  }

  for (const [how, settings, python, builds] of [
    ['the python option names an interpreter: it runs the daemon, and nothing is built',
      { user: pythonOption('/opt/py/bin/python3.12', 'lich-control@lich-control') }, '/opt/py/bin/python3.12', 0],
    ["the python option in managed settings wins over the user's",
      { user: pythonOption('/home/me/py'), policy: pythonOption('/opt/managed/python') }, '/opt/managed/python', 0],
    ["a python option in a project's settings is not read",
      { project: pythonOption('./evil'), local: pythonOption('./evil') }, ENV_PYTHON, 1],
  ] as const) {
    test(how, async ($, on) => {
      const world = await spawnedWith($, on, { settings })
      expect(world.child.request.argv).toEqual([python, '-m', 'lich_control'])
      expect(world.envSet.LICH_CONTROL_PYTHON).toBe(python)
      expect(world.setups).toHaveLength(builds)
    })
  }

  // What /config sets: the manifest's userConfig field, handed to the module as options.
  test('the python option set in /config runs the daemon, and nothing is built', { options: { python: ' /opt/py/bin/python3.13 ' } }, async ($, on) => {
    const world = await spawnedWith($, on)
    expect(world.child.request.argv).toEqual(['/opt/py/bin/python3.13', '-m', 'lich_control'])
    expect(world.envSet.LICH_CONTROL_PYTHON).toBe('/opt/py/bin/python3.13')
    expect(world.setups).toHaveLength(0)
  })

  test('the python option set in /config wins over a value stored under the bare name', { options: { python: '/opt/config/python' } }, async ($, on) => {
    const world = await spawnedWith($, on, { settings: { user: pythonOption('/home/me/py') } })
    expect(world.child.request.argv).toEqual(['/opt/config/python', '-m', 'lich_control'])
  })

  test('unset in /config (empty), the python option stored under the bare name still runs the daemon', { options: { python: '' } }, async ($, on) => {
    const world = await spawnedWith($, on, { settings: { user: pythonOption('/home/me/py') } })
    expect(world.child.request.argv).toEqual(['/home/me/py', '-m', 'lich_control'])
    expect(world.setups).toHaveLength(0)
  })
})

describe('next to lich-plugin', () => {
  const ROOT = '/home/me/.claude/plugins/cache/lich-plugin/lich'
  const enabled = (on: boolean) => ({ user: { enabledPlugins: { 'lich@lich-plugin': on, 'lich-control@lich-control': true } } })
  // lich-plugin's folder as a release installs it: its hooks/hooks.json, with
  // `modules` when the release has a mod, and the files that are there.
  const release = (version: string, modules: readonly string[] | undefined, files: readonly string[]) => {
    const root = `${ROOT}/${version}`
    const record = { version: 2, plugins: { 'lich@lich-plugin': [{ scope: 'user', installPath: root, version }] } }
    const hooks = { ...(modules && { modules }), hooks: { Stop: [{ hooks: [{ type: 'command', command: '${CLAUDE_PLUGIN_ROOT}/hooks/report-state.sh done' }] }] } }
    const folder = Object.fromEntries(files.map(file => [`${root}/hooks/${file}`, '// its mod\n']))
    folder[`${root}/hooks/hooks.json`] = JSON.stringify(hooks)
    return { installed: JSON.stringify(record), files: folder }
  }

  for (const [version, module] of [
    ['0.14.0', 'mod-control.js'],
    ['0.20.0', 'lich.js'],
  ] as const) {
    test(`lich-plugin ${version} registers its mod (${module}): it polls for the session, so no daemon starts, and the log says why`, async ($, on) => {
      const files = [module, 'report-state.sh']
      const world = await started($, on, { settings: enabled(true), ...release(version, [`./${module}`], files) })
      await world.untilLogged(`registers a mod (${ROOT}/${version}/hooks/${module}) that polls lich for this session itself`)
      await world.clock.settle()
      expect(world.setups).toHaveLength(0)
      expect(world.children).toHaveLength(0)
    })
  }

  for (const [how, on, version, modules, files] of [
    ['a lich-plugin that registers no mod (0.13) has no client of its own', true, '0.13.1', undefined, ['report-state.sh']],
    ['a mod its hooks.json names but its folder lacks cannot load', true, '0.14.0', ['./mod-control.js'], ['report-state.sh']],
    ['lich-plugin disabled', false, '0.14.0', ['./mod-control.js'], ['mod-control.js']],
  ] as const) {
    test(`${how}: the daemon starts, and the log says nothing of it`, async ($, hook) => {
      const world = await spawnedWith($, hook, { settings: enabled(on), ...release(version, modules, files) })
      expect(world.logs.some(line => line.includes('lich@lich-plugin'))).toBe(false)
    })
  }

  // Claude Code keeps its install record there when the variable is set.
  test('with CLAUDE_CODE_PLUGIN_CACHE_DIR set, the install record is read in that folder', async ($, on) => {
    const { installed, files } = release('0.14.0', ['./mod-control.js'], ['mod-control.js'])
    const cache = { ...files, '/var/cache/cc/installed_plugins.json': installed }
    const world = await started($, on, { settings: enabled(true), files: cache }, { ...LICH, CLAUDE_CODE_PLUGIN_CACHE_DIR: '/var/cache/cc' })
    await world.untilLogged('registers a mod')
    await world.clock.settle()
    expect(world.children).toHaveLength(0)
  })

  test('lich-plugin enabled, its install unknown: said plainly, and the daemon starts', async ($, on) => {
    const world = await spawnedWith($, on, { settings: enabled(true) })
    expect(world.logs.find(line => line.includes('lich@lich-plugin'))).toContain('what it registers could not be read')
  })
})

describe('Windows', () => {
  const PORT = 50123
  const BRIDGE_SECRET = 'bridge-secret-4f9a'

  test('the setup runs with the py launcher, the daemon from what it names', async ($, on) => {
    const world = await spawnedWith($, on, { platform: 'windows' })
    expect(world.setups.map(setup => setup.request.argv.slice(0, 2))).toEqual([['py', '-3']])
    expect(world.child.request.argv).toEqual([ENV_PYTHON, '-m', 'lich_control'])
    expect(world.child.request.env.LICH_CONTROL_PARENT_PID).toBe('77')
  })

  test('without the py launcher, python on PATH runs the setup', async ($, on) => {
    const world = await spawnedWith($, on, { platform: 'windows', missing: ['py'] })
    expect(world.setups.map(setup => setup.request.argv[0])).toEqual(['python'])
  })

  test('with neither, one line names both and what to do', async ($, on) => {
    const world = await started($, on, { platform: 'windows', missing: ['py', 'python'] })
    await world.untilLogged('cannot set up')
    expect(world.logs.find(line => line.includes('cannot set up'))).toContain('py -3 nor python did not run (py -3: ')
    expect(world.statuses[world.statuses.length - 1]).toContain('Install Python 3.9 or later, then /reload-plugins')
    expect(world.children).toHaveLength(0)
  })

  test('a hello with a port and a secret: each post goes to that loopback port carrying the secret, which no log line holds', async ($, on) => {
    const world = await spawnedWith($, on, { platform: 'windows' })
    world.child.helloTcp(PORT, BRIDGE_SECRET)
    await $.turn.start({ text: 'go', turnId: 't1' })
    world.child.write(JSON.stringify({ op: 'call', id: 'c1', method: 'overrides.set', args: { model: 'm' } }) + '\r\n')
    await world.untilResults(1)
    expect(world.results()).toEqual([{ id: 'c1', ok: true, value: null }])
    expect(world.posts.map(post => [post.url, post.socket, post.secret])).toEqual([
      [`http://127.0.0.1:${PORT}/v1/event`, undefined, BRIDGE_SECRET],
      [`http://127.0.0.1:${PORT}/v1/result`, undefined, BRIDGE_SECRET],
    ])
    expect(world.logs).toContain(`lich-control: the daemon 4242 (0.1.0, protocol 1) listens on 127.0.0.1:${PORT}`)
    expect(world.logs.filter(line => line.includes(BRIDGE_SECRET))).toEqual([])
  })

  for (const [how, hello] of [
    ['a port without a secret', { port: PORT }],
    ['a secret without a port', { secret: BRIDGE_SECRET }],
    ['a port out of range', { port: 70000, secret: BRIDGE_SECRET }],
  ] as const) {
    test(`a hello with ${how} is no hello: said, and nothing is posted`, async ($, on) => {
      const world = await spawnedWith($, on, { platform: 'windows' })
      world.child.line({ op: 'hello', protocol: 1, pid: 4242, ...hello, version: '0.1.0' })
      await $.turn.start({ text: 'go', turnId: 't1' })
      await world.untilLogged('said hello without a socket, nor a port and a secret')
      await world.clock.settle()
      expect(world.posts).toEqual([])
      expect(world.logs.filter(line => line.includes(BRIDGE_SECRET))).toEqual([])
    })
  }

  test('on Linux a Unix socket hello posts on that socket, with no secret', async ($, on) => {
    const world = await connected($, on, '/run/lich-control/s1.sock')
    await $.turn.start({ text: 'go', turnId: 't1' })
    await world.until(() => world.posts.length === 1)
    expect(world.posts.map(post => [post.url, post.socket, post.secret])).toEqual([['http://lich-control/v1/event', '/run/lich-control/s1.sock', undefined]])
    expect(world.setups.map(setup => setup.request.argv[0])).toEqual(['python3'])
  })

  test('under WSL, Linux to the daemon, the setup runs with python3', async ($, on) => {
    const world = await spawnedWith($, on, { platform: 'wsl' })
    expect(world.setups.map(setup => setup.request.argv[0])).toEqual(['python3'])
  })
})

const USAGE = { input_tokens: 10, output_tokens: 5, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 }

// Settings that give the plugin, by the key they name it with, a python option.
function pythonOption(python: string, key = 'lich-control') {
  return { pluginConfigs: { [key]: { options: { python } } } }
}

// The world, arranged so, once an interactive session has started in it.
async function started($: Engine, on: On, arrange: Partial<World> = {}, env = LICH) {
  const world = Object.assign(new World(on, env), arrange)
  await $.session.start(INTERACTIVE)
  return world
}

// That world once the session has spawned its daemon.
async function spawnedWith($: Engine, on: On, arrange: Partial<World> = {}) {
  const world = await started($, on, arrange)
  await world.untilSpawned(1)
  return world
}

// The world once that daemon has said hello, listening on `socket`.
async function connected($: Engine, on: On, socket = '/s1') {
  const world = await spawnedWith($, on)
  world.child.hello(socket)
  return world
}

function byId(results: any[]): Record<string, any> {
  return Object.fromEntries(results.map(result => [result.id, result]))
}

// Reads a stream to its end, as the engine reads a model response.
async function drain(stream: AsyncGenerator<unknown, unknown>) {
  for await (const _ of stream);
}
