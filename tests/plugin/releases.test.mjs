// The relay (hooks/mod-control.js) on a Claude Code that lacks a late `$`
// call, under Node's own test runner: `claude plugin test` runs the suite
// inside the pinned engine, whose `$` has every call, so here the `$` is
// made by hand, the pinned one's shape less what an older release lacks
// (docs/install.md, "Which Claude Code"). A call a release lacks is
// undefined on its `$`, as there: calling it throws a TypeError at once.
//
//   node --test tests/plugin/releases.test.mjs
import assert from 'node:assert/strict'
import { dirname, join } from 'node:path'
import { test } from 'node:test'
import { fileURLToPath, pathToFileURL } from 'node:url'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const HOME = '/home/me'
const LICH = { LICH_PORT: '4100', LICH_TOKEN: 'secret-token', LICH_SESSION_ID: 'card-1', HOME }
const HOOK_ENV = { CLAUDE_PID: '77', CLAUDE_PLUGIN_DATA: `${HOME}/.claude/plugins/data/lich-control-inline` }
const ENV_PYTHON = '/data/env/bin/python'
const INTERACTIVE = { cwd: `${HOME}/project`, surface: 'terminal', isInteractive: true }

let loads = 0

// A session of one release, as far as the relay sees it: the `$` it calls,
// what it spawned and logged, and waits that resolve on what happened.
class Session {
  spawned = []
  logs = []
  // What $.ui.log put in the transcript (no { to: 'debug' }), and what $.ui.status pinned.
  transcript = []
  statuses = []
  submitted = []
  posts = []
  // Files read that are not there: in Claude Code each is an [ERROR] line of the debug log.
  missingReads = []
  waiters = []

  // lacking: the `$` calls this release does not have, as 'noun.event';
  // settings: the merged settings; keyedSettings: whether settings.read
  // answers { key } with that key's value (2.1.304 on) or ignores it;
  // setup: what the setup script answers, its lines on stdout.
  constructor({ lacking = [], root = ROOT, settings = {}, keyedSettings = true, files = {}, env = {},
    setup = [{ ok: true, python: ENV_PYTHON, built: false }] } = {}) {
    this.files = files
    this.setup = setup
    const session = this
    this.$ = {
      plugin: { name: 'lich-control', root },
      env: {
        get: async name => ({ ...LICH, ...env })[name],
        set: async () => ({}),
      },
      settings: {
        read: async ({ source, key } = {}) => {
          if (source !== undefined) return {}
          return key !== undefined && keyedSettings ? settings[key] : settings
        },
      },
      fs: {
        read: async path => {
          if (path in session.files) return session.files[path]
          session.missingReads.push(path)
          throw new Error(`ENOENT: ${path}`)
        },
        exists: async path => path in session.files,
      },
      ui: {
        log: (text, options) => session.#note(() => (options?.to === 'debug' ? session.logs : session.transcript).push(text)),
        status: text => session.#note(() => session.statuses.push(text)),
      },
      session: { info: async () => ({ platform: 'linux', isHosted: false }) },
      clock: { sleep: async () => {}, now: async () => 0 },
      process: {
        hookEnv: async () => HOOK_ENV,
        spawn: request => session.#spawn(request),
      },
      http: {
        // Claude Code's check of the URL first, which fetches nothing.
        fetch: async (url, init) => {
          if (!/^https?:/.test(url)) throw new Error(`lich-control: $.http.fetch: ${url} refused: http or https only`)
          session.#note(() => session.posts.push({ path: new URL(url).pathname, body: JSON.parse(init.body) }))
          return { status: 204, text: '' }
        },
      },
      prompt: {
        // As 2.1.280's: asUser is not read, and the prompt goes in under the plugin's name.
        submit: async ({ text }) => {
          session.#note(() => session.submitted.push(text))
          return { text, origin: { kind: 'plugin', name: 'lich-control' } }
        },
      },
    }
    for (const call of lacking) {
      const [noun, event] = call.split('.')
      delete this.$[noun][event]
    }
  }

  async start() {
    const { register } = await import(`${pathToFileURL(join(ROOT, 'hooks', 'mod-control.js'))}?load=${++loads}`)
    const hooks = {}
    register((event, hook) => (hooks[event] = hook))
    await hooks['session.start'](this.$, INTERACTIVE, async () => ({ cwd: INTERACTIVE.cwd }))
    return this
  }

  until(ready) {
    if (ready()) return Promise.resolve()
    return new Promise(resolve => this.waiters.push({ ready, resolve }))
  }

  untilLogged(words) {
    return this.until(() => this.logs.some(line => line.includes(words)))
  }

  // The setup script's runs and the daemon's, by what they run.
  setups() {
    return this.spawned.filter(child => isSetup(child.request))
  }

  daemons() {
    return this.spawned.filter(child => child.request.argv.includes('lich_control'))
  }

  #note(change) {
    change()
    this.waiters = this.waiters.filter(waiter => !(waiter.ready() && (waiter.resolve(), true)))
  }

  // A child that writes what the test gives it and ends when told; the setup
  // script answers at once that the environment is ready.
  #spawn(request) {
    const pieces = []
    let wake = () => {}
    let end
    const child = {
      request,
      write: text => (pieces.push({ stream: 'stdout', text }), wake()),
      exit: code => ((end = { code, signal: null }), wake()),
    }
    let settle
    const stream = (async function* () {
      for (;;) {
        if (pieces.length > 0) yield pieces.shift()
        else if (end) return settle(end), end
        else await new Promise(resolve => (wake = resolve))
      }
    })()
    stream.result = new Promise(resolve => (settle = resolve))
    this.#note(() => this.spawned.push(child))
    if (isSetup(request)) {
      for (const line of this.setup) child.write(JSON.stringify(line) + '\n')
      child.exit(this.setup.at(-1).ok ? 0 : 1)
    }
    return stream
  }
}

function isSetup(request) {
  return request.argv.some(arg => String(arg).endsWith('lich_runtime.py'))
}

test('without $.process.hookEnv (before 2.1.326), the daemon starts, named no parent, with the data folder Claude Code keeps', async t => {
  for (const [how, options, data] of [
    ['loaded from a folder (--plugin-dir)', {}, `${HOME}/.claude/plugins/data/lich-control-inline`],
    ['installed from a marketplace', {
      root: `${HOME}/.claude/plugins/cache/lich-control/lich-control/0.1.0`,
      files: { [`${HOME}/.claude/plugins/installed_plugins.json`]: JSON.stringify({ version: 2, plugins: {
        'lich-control@lich-control': [{ scope: 'user', installPath: `${HOME}/.claude/plugins/cache/lich-control/lich-control/0.1.0` }],
      } }) },
    }, `${HOME}/.claude/plugins/data/lich-control-lich-control`],
    ['installed from a marketplace added from a folder, which runs the plugin there', {
      root: `${HOME}/src/lich-control`,
      files: { [`${HOME}/.claude/plugins/installed_plugins.json`]: JSON.stringify({ version: 2, plugins: {
        'lich@lich-plugin': [{ scope: 'user', installPath: `${HOME}/.claude/plugins/cache/lich-plugin/lich/0.20.0` }],
        'lich-control@local': [{ scope: 'user', installPath: `${HOME}/.claude/plugins/cache/local/lich-control/0.1.0` }],
      } }) },
    }, `${HOME}/.claude/plugins/data/lich-control-local`],
    ['with the plugins folder moved (CLAUDE_CODE_PLUGIN_CACHE_DIR)', { env: { CLAUDE_CODE_PLUGIN_CACHE_DIR: '/srv/plugins' } },
      '/srv/plugins/data/lich-control-inline'],
  ]) {
    await t.test(how, async () => {
      const session = await new Session({ lacking: ['process.hookEnv'], ...options }).start()
      await session.until(() => session.daemons().length === 1)
      assert.deepEqual(session.setups()[0].request.env, { CLAUDE_PLUGIN_DATA: data })
      // No LICH_CONTROL_PARENT_PID: the daemon takes the parent it finds.
      assert.deepEqual(session.daemons()[0].request.env, { CLAUDE_PLUGIN_DATA: data })
      assert.deepEqual(session.daemons()[0].request.argv, [ENV_PYTHON, '-m', 'lich_control'])
      assert.deepEqual(session.missingReads, [])
    })
  }
})

test('without $.session.info (before 2.1.326), the plugin\'s folder tells Windows, where the setup runs with py -3', async t => {
  await t.test('a Windows folder: py -3 runs the setup, and the daemon starts', async () => {
    const session = await new Session({ lacking: ['session.info'], root: 'C:\\Users\\me\\.claude\\plugins\\cache\\lich-control' }).start()
    await session.until(() => session.daemons().length === 1)
    assert.deepEqual(session.setups()[0].request.argv.slice(0, 2), ['py', '-3'])
  })

  await t.test('a Linux folder (WSL too): python3 runs it, and the daemon starts', async () => {
    const session = await new Session({ lacking: ['session.info'] }).start()
    await session.until(() => session.daemons().length === 1)
    assert.equal(session.setups()[0].request.argv[0], 'python3')
    assert.deepEqual(session.logs, [])
  })
})

test('where settings.read ignores { key } (before 2.1.304), an enabled lich-plugin with a mod is still seen, and no daemon starts', async () => {
  const lichPlugin = `${HOME}/.claude/plugins/cache/lich-plugin/lich/0.20.0`
  const session = await new Session({
    keyedSettings: false,
    settings: { enabledPlugins: { 'lich@lich-plugin': true, 'lich-control@lich-control': true } },
    files: {
      [`${HOME}/.claude/plugins/installed_plugins.json`]: JSON.stringify({ version: 2, plugins: {
        'lich@lich-plugin': [{ scope: 'user', installPath: lichPlugin }],
      } }),
      [`${lichPlugin}/hooks/hooks.json`]: JSON.stringify({ modules: ['./lich.js'] }),
      [`${lichPlugin}/hooks/lich.js`]: '// its mod\n',
    },
  }).start()
  await session.untilLogged(`registers a mod (${lichPlugin}/hooks/lich.js) that polls lich for this session itself`)
  assert.equal(session.spawned.length, 0)
})

test('where prompt.submit does not read asUser (before 2.1.286), a notification prompt is submitted all the same, and its result posted', async () => {
  const session = await new Session({ lacking: ['process.hookEnv', 'session.info'] }).start()
  await session.until(() => session.daemons().length === 1)
  const [daemon] = session.daemons()
  daemon.write(JSON.stringify({ op: 'hello', protocol: 1, pid: 4242, socket: '/s1', version: '0.1.0' }) + '\n')
  const text = '<task-notification>\n<status>completed</status>\n<summary>ci done</summary>\n<result>3 passed</result>\n</task-notification>'
  daemon.write(JSON.stringify({ op: 'call', id: 'c1', method: 'prompt.submit', args: { text, asUser: true } }) + '\n')
  await session.until(() => session.posts.some(post => post.path === '/v1/result'))
  assert.deepEqual(session.submitted, [text])
  assert.deepEqual(session.posts.find(post => post.path === '/v1/result').body, {
    id: 'c1',
    ok: true,
    value: { text, origin: { kind: 'plugin', name: 'lich-control' } },
  })
})

test('without $.ui.status (every release the relay runs on has it, from 2.1.259), the setup\'s lines go in the transcript', async () => {
  const problem = 'pip: the package index could not be reached'
  const session = await new Session({
    lacking: ['ui.status'],
    setup: [{ building: '/data/env' }, { ok: false, error: `lich-control cannot set up its Python environment: ${problem}.`, problem }],
  }).start()
  await session.until(() => session.transcript.length === 2)
  assert.deepEqual(session.transcript, [
    'lich-control: setting up Python for lich (first run)…',
    `lich-control: cannot set up Python for lich: ${problem}. Mend that, then /reload-plugins`,
  ])
  assert.deepEqual(session.statuses, [])
  assert.equal(session.daemons().length, 0)
})

// The next call a release turns out to lack, where nothing checks for it:
// what keeps the daemon from starting is said, with its cause.
test('a throw while the daemon is being started is logged with its cause, and nothing is left half started', async () => {
  const session = await new Session({ lacking: ['env.set'] }).start()
  await session.untilLogged('lich-control could not start its daemon, so lich cannot control this session:')
  assert.match(session.logs.at(-1), /env\.set/)
  assert.equal(session.daemons().length, 0)
})
