// What lies beneath the relay in its tests: the setup script's and the
// daemon's child processes, the daemon's Unix socket, the $ calls the daemon
// asks for, the settings and the debug log, each answered from memory and
// recorded, with waits that resolve on what happened rather than on time.
import { mock } from 'claude-code/testing'
import type { On } from 'claude-code'

export const LICH = { LICH_PORT: '4100', LICH_TOKEN: 'secret-token', LICH_SESSION_ID: 'card-1' }
export const DATA = '/data/lich-control'
// The interpreter of the private environment the setup script names.
export const ENV_PYTHON = `${DATA}/env-0.1.0-0123456789ab/bin/python`
export const SETUP = 'hooks/lich_runtime.py'
type Source = 'user' | 'project' | 'local' | 'flag' | 'policy'

// `url` and `secret` (the header a loopback daemon checks) as the relay sent them.
type Post = { path: string; url: string; socket: string | undefined; secret: string | undefined; body: any }
type Exit = { code: number | null; signal: string | null }

// One run of the daemon as the test plays it: what it writes, how it ends.
export class Child {
  private pieces: { stream: 'stdout' | 'stderr'; text: string }[] = []
  private end: Exit | undefined
  private wake: (() => void) | undefined
  // Whether the relay ended it: Claude Code aborts the spawn's signal where
  // the relay leaves the loop, and ends the child.
  ended = false

  constructor(readonly request: any) {}

  write(text: string, stream: 'stdout' | 'stderr' = 'stdout') {
    this.pieces.push({ stream, text })
    this.poke()
  }

  line(message: object) {
    this.write(JSON.stringify(message) + '\n')
  }

  hello(socket: string) {
    this.line({ op: 'hello', protocol: 1, pid: 4242, socket, version: '0.1.0' })
  }

  // A Windows daemon's hello: loopback TCP behind a secret, its line ended
  // as Windows Python's text-mode stdout ends it.
  helloTcp(port: number, secret: string) {
    this.write(JSON.stringify({ op: 'hello', protocol: 1, pid: 4242, port, secret, version: '0.1.0' }) + '\r\n')
  }

  // The setup script saying it builds, as it starts to.
  building() {
    this.line({ building: `${DATA}/env-0.1.0-0123456789ab` })
  }

  // The setup script's end: a step on stderr, then the result line.
  ready(built: boolean) {
    if (built) this.write(`creating a virtual environment in ${DATA}/env-0.1.0-0123456789ab\n`, 'stderr')
    this.line({ ok: true, python: ENV_PYTHON, built })
    this.exit(0)
  }

  failed(error: string, problem?: string) {
    this.line({ ok: false, error, ...(problem !== undefined && { problem }) })
    this.exit(1)
  }

  call(id: string, method: string, args: object) {
    this.line({ op: 'call', id, method, args })
  }

  exit(code: number | null, signal: string | null = null) {
    this.end = { code, signal }
    this.poke()
  }

  async *run(signal?: AbortSignal): AsyncGenerator<{ stream: 'stdout' | 'stderr'; text: string }, Exit> {
    signal?.addEventListener('abort', () => {
      this.ended = true
      this.poke()
    })
    for (;;) {
      const piece = this.pieces.shift()
      if (this.ended) return { code: null, signal: 'SIGTERM' }
      if (piece) yield piece
      else if (this.end) return this.end
      else await new Promise<void>(resolve => (this.wake = resolve))
    }
  }

  private poke() {
    const wake = this.wake
    this.wake = undefined
    wake?.()
  }
}

export class World {
  readonly clock
  // The daemon's runs (refused ones too), the setup script's apart.
  readonly children: Child[] = []
  readonly setups: Child[] = []
  readonly posts: Post[] = []
  readonly logs: string[] = []
  // What $.ui.status pinned, call by call (undefined: cleared).
  readonly statuses: (string | undefined)[] = []
  // The model requests that reach the bottom, as the relay passed them on.
  readonly steps: any[] = []
  // How the model answers them: at once, with nothing, unless replaced.
  respond = async function* (e: any): AsyncGenerator<any, any> {
    return answered(e)
  }
  // What $.env.set wrote, by name.
  readonly envSet: Record<string, string | undefined> = {}
  // The settings files by source; a read with no source gets them merged
  // (shallowly: no test splits a key across sources).
  settings: Partial<Record<Source, any>> = {}
  // Claude Code's install record (installed_plugins.json) as text, or none.
  installed: string | undefined
  // Other files $.fs reads, by path, as text.
  files: Record<string, string> = {}
  // What $.process.hookEnv answers (CLAUDE_PID: the engine, which spawns
  // the children); undefined, it rejects.
  hookEnv: Record<string, string> | undefined = { CLAUDE_PID: '77', CLAUDE_PLUGIN_DATA: DATA }
  // What $.session.info answers of the platform.
  platform: string = 'linux'
  // Unless held, each setup run answers at once that the environment is ready.
  holdSetup = false
  // The next post to this path is held until `release()`; later ones pass.
  holdPath: string | undefined
  // Set, every spawn of the daemon (of the setup script) is refused with it,
  // as a host that cannot start the child.
  refuseSpawn: string | undefined
  refuseSetup: string | undefined
  // Interpreters (argv[0]) not found: a setup run with one is refused.
  missing: string[] = []
  // Set, every $.http.fetch is refused, why in these words, as Claude Code
  // 2.1.280 to 2.1.287 refuses them while nonessential traffic is off.
  refuseFetch: string | undefined
  private held: (() => void)[] = []
  // What the test waits on, re-checked whenever the world changes.
  private waiters: { ready: () => boolean; resolve: () => void }[] = []

  constructor(on: On, env: Record<string, string> = LICH) {
    this.clock = mock.clock(on)
    mock.env(on, env)
    on('session.start', async ($, e) => ({ cwd: e.cwd }))
    on('turn.start', async ($, e) => ({ turnId: e.turnId }))
    on('turn.complete', async ($, e) => ({ text: e.answer }))
    on('ui.log', ($, e) => {
      this.logs.push(e.text)
      this.changed()
      return { value: undefined }
    })
    on('ui.status', ($, e) => {
      this.statuses.push(e.text)
      this.changed()
      return { value: undefined }
    })
    on('process.hookEnv', () => (this.hookEnv ? { value: this.hookEnv } : { deny: 'the plugin data folder could not be made' }))
    on('env.set', ($, e) => {
      this.envSet[e.name] = e.value
      this.changed()
      return { value: {} }
    })
    const merged = () => Object.assign({}, ...Object.values(this.settings))
    on('settings.read', ($, e) => ({ value: e.source ? (this.settings[e.source] ?? {}) : merged() }))
    const record = (path: string) => this.installed !== undefined && path.endsWith('/plugins/installed_plugins.json')
    on('fs.read', ($, e) => {
      if (record(e.path)) return { value: this.installed }
      if (e.path in this.files) return { value: this.files[e.path] }
      return { deny: `ENOENT: no such file, ${e.path}` }
    })
    on('fs.exists', ($, e) => ({ value: record(e.path) || e.path in this.files }))
    on('session.info', () => ({ value: { platform: this.platform as any, isHosted: false } }))
    const world = this
    on('process.spawn', async function* ($, e, next) {
      if (e.argv.some(arg => String(arg).endsWith(SETUP))) {
        if (world.missing.includes(e.argv[0])) return { deny: `no such file: ${e.argv[0]}` }
        if (world.refuseSetup !== undefined) return { deny: world.refuseSetup }
        const setup = new Child(e)
        world.setups.push(setup)
        world.changed()
        if (!world.holdSetup) setup.ready(false)
        return { value: yield* setup.run() }
      }
      const child = new Child(e)
      world.children.push(child)
      world.changed()
      if (world.refuseSpawn !== undefined) return { deny: world.refuseSpawn }
      return { value: yield* child.run(next.signal) }
    })
    on('turn.step', async function* ($, e) {
      world.steps.push(e)
      return yield* world.respond(e)
    })
    // Claude Code's gate first, then its check of the URL (neither fetches).
    on('http.fetch', async ($, e) => {
      if (this.refuseFetch !== undefined) return { deny: `refused: ${this.refuseFetch}` }
      if (!/^https?:/.test(e.url)) return { deny: `${e.url} refused: http or https only` }
      const path = new URL(e.url).pathname
      if (path === this.holdPath) {
        this.holdPath = undefined
        await new Promise<void>(resolve => this.held.push(resolve))
      }
      const headers: Record<string, string> = (e.init?.headers as any) ?? {}
      const secret = Object.entries(headers).find(([name]) => name.toLowerCase() === 'x-lich-control-secret')?.[1]
      this.posts.push({ path, url: e.url, socket: e.init?.socketPath, secret, body: JSON.parse(String(e.init?.body)) })
      this.changed()
      return { value: { status: 204, ok: true, headers: {}, text: '' } }
    })
  }

  get child(): Child {
    return this.children[this.children.length - 1]
  }

  results(): any[] {
    return this.posts.filter(p => p.path === '/v1/result').map(p => p.body)
  }

  release() {
    for (const resolve of this.held.splice(0)) resolve()
  }

  // Resolves once `ready()` holds; the test's own timeout bounds it.
  until(ready: () => boolean): Promise<void> {
    if (ready()) return Promise.resolve()
    return new Promise(resolve => this.waiters.push({ ready, resolve }))
  }

  untilSetUp(count: number) {
    return this.until(() => this.setups.length >= count)
  }

  untilSpawned(count: number) {
    return this.until(() => this.children.length >= count)
  }

  untilResults(count: number) {
    return this.until(() => this.results().length >= count)
  }

  untilShown(text: string | undefined) {
    return this.until(() => this.statuses.includes(text))
  }

  untilLogged(text: string) {
    return this.until(() => this.logs.some(line => line.includes(text)))
  }

  private changed() {
    this.waiters = this.waiters.filter(waiter => {
      if (!waiter.ready()) return true
      waiter.resolve()
      return false
    })
  }
}

// A model request as the engine would raise it on the main loop.
export function step(index: number, turnId = 't1') {
  return { turnId, index, model: 'claude-sonnet-4-5', effort: 'medium' as const, messageCount: 3 }
}

export function answered(e: { turnId: string; index: number }) {
  return { turnId: e.turnId, index: e.index, answer: '', toolUses: [], stopReason: null, usage: null }
}
