// The relay's half of the bridge (protocol 1), which both relays share: the
// Claude Code mod (mod-control.js) and the opencode plugin
// (opencode/lich-control.js). It sets up the daemon's Python, keeps the
// daemon's life, reads the lines it writes, performs the calls it asks for
// and posts their results, posts the turn events in order, holds the
// overrides it set, and restarts it when it dies. Written for neither host:
// no Node (a Claude Code mod has none) and no `$` (opencode has none); each
// relay hands in how its host runs a child, performs a call, posts to the
// daemon, tells time and logs.
//
// Where the daemon listens is its hello's to say, as an address: {socket}, a
// Unix socket (Linux, macOS), or {port, secret}, loopback TCP where there are
// no Unix sockets (Windows: Claude Code's $.http.fetch takes no named pipe),
// every request carrying the secret in SECRET_HEADER. The secret lives in
// that address alone: no log line and no error text carries it.

const RESTARTS = 5
const FIRST_DELAY_MS = 1000
// A daemon that ran this long before it died earns a fresh restart budget.
const HEALTHY_MS = 60_000
// Exit 2: the daemon refused its configuration (bridge.md); a restart cannot mend that.
const CONFIG_ERROR = 2
// Exit 75: another daemon still polls for the session (one on its way out,
// or one a person is stopping). That passes: the daemon is started again
// after a pause for as long as it lasts, outside the restart budget.
const LOCK_HELD = 75
// A post that failed on the way is sent again after a pause, twice at most.
const POST_ATTEMPTS = 3
const RETRY_PAUSE_MS = 250
// At most this many posts are on their way to the daemon at once, each on a
// connection of its own; the rest wait their turn in order. A burst (a
// thousand asks settling together) would otherwise open a thousand
// connections in one go, more than the socket's listen backlog queues, and
// those past it are refused (connect EAGAIN, write EPIPE).
const POSTS_AT_ONCE = 8
export const NO_OVERRIDES = { model: null, effort: null }
// The header a loopback daemon checks each request's secret in (bridge.md).
export const SECRET_HEADER = 'X-Lich-Control-Secret'
// Builds the daemon's private Python environment and names its interpreter
// (its docstring has the protocol), from the project's folder.
export const SETUP = 'hooks/lich_runtime.py'
const CANNOT = 'lich-control cannot set up its Python environment'

// What a host's send throws where the host refuses the relay's posts to the
// daemon for good, whatever they carry (a Claude Code with nonessential
// traffic off, or an organization's policy: docs/install.md); its message
// says why, in the host's words. No retry mends it.
export class Refused extends Error {}

export class Bridge {
  constructor() {
    // Settles with the running daemon's address once its hello arrives, or
    // with null once it is known that no daemon will run (again): posts
    // then drain at once instead of piling up behind a hello that never
    // comes. Each daemon's life is one of these.
    this.daemon = deferred()
    // The tail of the event chain: each event is posted once the one before
    // it settled, so the daemon sees them in the order the hooks fired.
    this.events = Promise.resolve()
    // The running turn and the daemon life it was sent to, so that a
    // restarted daemon hears of it once.
    this.turn = null
    // What the daemon set; a daemon's overrides end with it, as lich hears from it.
    this.overrides = NO_OVERRIDES
    // Why, once the host refuses a post to the daemon: a daemon then takes
    // lich's commands and can never report what came of them, so it is
    // ended, and none runs again.
    this.refusal = undefined
    // Aborted, it ends the running daemon: one for each daemon's life.
    this.ending = new AbortController()
    this.host = null
    this.posting = new Semaphore(POSTS_AT_ONCE)
  }

  // Runs the daemon to its end, and again after a crash, until it exits for
  // good, the host has stopped or it refuses the posts; then no daemon will
  // run. The host:
  //   run(onLine, signal)    runs the daemon once to its end, each stdout line
  //                          to onLine; resolves {code, signal} or {error}, never rejects;
  //                          ends the daemon (as a stop signal does) once the AbortSignal
  //                          aborts, which only a send that throws Refused makes it do
  //   invoke(method, args)   performs a call of the daemon on the host
  //   send(address, path, body)  one POST to the daemon at `address` (its
  //                          hello's: {socket} or {port, secret}): {status, text};
  //                          throws Refused where the host refuses it for good
  //   now(), sleep(ms)       the host's clock (now may give undefined)
  //   log(level, text)       a line for whoever debugs the relay
  //   stopped()              (optional) true once the relay is being unloaded
  async serve(host) {
    this.host = host
    let restarts = 0
    let lockHeld = false
    while (!host.stopped?.() && this.refusal === undefined) {
      // Not awaited: the daemon starts the moment serve() is called.
      const began = host.now()
      this.ending = new AbortController()
      const end = await host.run(line => this.#receive(line), this.ending.signal)
      // Its address went with it: what comes next waits for the next hello.
      if (this.daemon.value !== undefined) this.daemon = deferred()
      this.overrides = NO_OVERRIDES
      if (host.stopped?.() || this.refusal !== undefined || end.code === 0) break
      if (end.code === CONFIG_ERROR) {
        host.log('error', `the daemon ${describe(end)}: its configuration is wrong; not restarting it`)
        break
      }
      if (end.code === LOCK_HELD) {
        if (!lockHeld) host.log('warn', `the daemon ${describe(end)}: another daemon still polls for this session; starting it again every few seconds until that one is gone`)
        lockHeld = true
        await host.sleep(FIRST_DELAY_MS)
        continue
      }
      lockHeld = false
      const [from, to] = [await began, await host.now()]
      if (from !== undefined && to !== undefined && to - from >= HEALTHY_MS) restarts = 0
      if (restarts === RESTARTS) {
        host.log('error', `the daemon ${describe(end)}; not restarting it again`)
        break
      }
      const wait = FIRST_DELAY_MS * 2 ** restarts
      restarts += 1
      host.log('warn', `the daemon ${describe(end)}; restart ${restarts} of ${RESTARTS} in ${wait} ms`)
      await host.sleep(wait)
    }
    this.close()
  }

  // No daemon will run (again).
  close() {
    this.daemon.settle(null)
  }

  turnStarted(turnId) {
    this.turn = { id: turnId, sentTo: this.daemon }
    this.#forward('turn.start', turnId)
  }

  // Every end goes over: the daemon ignores the ends of turns it did not record.
  turnEnded(turnId) {
    if (this.turn?.id === turnId) this.turn = null
    this.#forward('turn.complete', turnId)
  }

  #receive(line) {
    // A Windows daemon's text-mode stdout ends each line with \r\n.
    line = line.replace(/\r$/, '')
    if (!line.trim()) return
    let message
    try {
      message = JSON.parse(line)
    } catch {
      this.host.log('warn', `the daemon wrote a line that is not JSON (${line.length} chars)`)
      return
    }
    const address = message?.op === 'hello' ? addressOf(message) : null
    if (address !== null) {
      this.host.log('info', `the daemon ${message.pid} (${message.version}, protocol ${message.protocol}) listens on ${address.socket ?? `127.0.0.1:${address.port}`}`)
      this.daemon.settle(address)
      // A daemon started mid-turn (a restart) would not know the turn to abort.
      if (this.turn !== null && this.turn.sentTo !== this.daemon) {
        this.turn.sentTo = this.daemon
        this.#forward('turn.start', this.turn.id)
      }
    } else if (message?.op === 'hello') {
      this.host.log('warn', 'the daemon said hello without a socket, nor a port and a secret: nothing can be posted to it')
    } else if (message?.op === 'call') {
      void this.#perform(message, this.daemon)
    } else {
      this.host.log('warn', `the daemon sent an unknown op ${JSON.stringify(message?.op)}`)
    }
  }

  // Started the moment its line is read and never awaited by the reader, so a
  // prompt waiting for an idle session holds up no abort behind it.
  async #perform({ id, method, args }, life) {
    let result
    try {
      result = { id, ok: true, value: (await this.host.invoke(method, args)) ?? null }
    } catch (err) {
      result = { id, ok: false, error: messageOf(err) }
    }
    // Call ids start again with each daemon: a result for one that has ended
    // would settle the next one's call of the same id.
    if (this.daemon !== life) {
      this.host.log('warn', `the daemon that asked for ${id} (${method}) has ended; its result is dropped`)
      return
    }
    await this.#post('/v1/result', result)
  }

  #forward(event, turnId) {
    const previous = this.events
    this.events = (async () => {
      await previous
      await this.#post('/v1/event', { event, turnId })
    })()
  }

  // Waits for the daemon's address and a free slot, then posts; never
  // throws. A post that failed on the way is sent again to the same daemon
  // after a pause, keeping its slot: the daemon closes a kept-alive
  // connection it finds idle at its limit, and a post written to it at that
  // moment never arrives; one it refused at its limit finds room once
  // others are done. Posting twice is safe: the daemon ignores a result for
  // a call already settled, and the turn events are idempotent.
  async #post(path, body) {
    const life = this.daemon
    const address = await life.promise
    if (address === null) return
    await this.posting.acquire()
    try {
      for (let attempt = 1; ; attempt++) {
        try {
          const { status, text } = await this.host.send(address, path, body)
          if (status < 200 || status >= 300) this.host.log('warn', `the daemon answered ${status} to ${path}: ${text.trim()}`)
          return
        } catch (err) {
          if (err instanceof Refused) return this.#refused(path, err.message)
          if (attempt === POST_ATTEMPTS || this.daemon !== life) {
            this.host.log('warn', `the daemon could not be reached for ${path}: ${messageOf(err)}`)
            return
          }
        }
        await this.host.sleep(RETRY_PAUSE_MS)
      }
    } finally {
      this.posting.release()
    }
  }

  // Ended, the daemon acks each command it holds with why (its shutdown;
  // on Windows it is ended outright, and lich settles them as for any
  // daemon gone), and the relay starts it no more.
  #refused(path, reason) {
    if (this.refusal !== undefined) return
    this.host.log('error', `the host refuses the relay's posts to the daemon (${path}: ${reason}); ending the daemon, which acks what it holds, and starting none again`)
    this.refusal = reason
    this.ending.abort()
  }
}

// `size` holders at a time; the others wait, first come first served.
class Semaphore {
  constructor(size) {
    this.free = size
    this.waiting = []
  }

  acquire() {
    if (this.free > 0) {
      this.free -= 1
      return Promise.resolve()
    }
    return new Promise(wake => this.waiting.push(wake))
  }

  // Handed straight to the next in line, if any.
  release() {
    const next = this.waiting.shift()
    if (next) next()
    else this.free += 1
  }
}

// Where a hello says the daemon listens: {socket}, or {port, secret}; null
// for a hello that names neither whole. Without a socket path or a port a
// post would have nowhere to go; without the secret every one would be refused.
function addressOf({ socket, port, secret }) {
  if (typeof socket === 'string' && socket) return { socket }
  if (Number.isInteger(port) && port > 0 && port < 65536 && typeof secret === 'string' && secret) return { port, secret }
  return null
}

// The system's Python to run the setup with, each an argv head, the first
// that runs taken; by the platform in Node's words (process.platform). On
// Windows no python3 is installed: the py launcher python.org's installer
// puts on PATH, else a python on PATH.
export function systemPythons(platform) {
  return platform === 'win32' ? [['py', '-3'], ['python']] : [['python3']]
}

// The headers of a post to the daemon at `address`: a loopback one reads
// its secret in SECRET_HEADER.
export function postHeaders({ secret }) {
  return { 'content-type': 'application/json', ...(secret !== undefined && { [SECRET_HEADER]: secret }) }
}

// Runs the setup once, to its end, with the first of `pythons` that runs.
// `run(python)` runs SETUP under that argv head and resolves {end, stdout}
// (how it ended, all it wrote there), or {error} where it could not run.
// Resolves {python}, the interpreter the setup names, or why there is none:
// {error}, the one line for the log, with what to do (`docs`, the page on
// naming an interpreter); {why}, the cause, and {problem}, the setup's
// own few words (else null), for a screen; {noPython}, true where no Python ran.
export async function setUp(run, pythons, docs) {
  const name = python => python.join(' ')
  const failures = []
  for (const python of pythons) {
    const ran = await run(python)
    if (ran.error !== undefined) {
      failures.push(pythons.length > 1 ? `${name(python)}: ${ran.error}` : ran.error)
      continue
    }
    const { python: named, error, problem } = setupResult(ran.stdout)
    if (named) return { python: named }
    const why = `${SETUP} ${describe(ran.end)} without a result`
    return { error: error ?? `${CANNOT}: ${why} (the lines above say why). Set the plugin's python option to an interpreter that has lich-control installed (${docs})`, why, problem }
  }
  const why = `${pythons.map(name).join(' nor ')} did not run (${failures.join('; ')})`
  return { error: `${CANNOT}: ${why}. Install Python 3.9 or later, or set the plugin's python option to an interpreter that has lich-control installed (${docs})`, why, problem: null, noPython: true }
}

// hooks/lich_runtime.py's answer, its last line on stdout (the script's
// docstring has the protocol): {python} once the environment is ready, else
// {error}, the one line that says why, and {problem}, what went wrong in a
// few words for a screen, each null when it wrote none.
function setupResult(stdout) {
  let result
  try {
    result = JSON.parse(stdout.trim().split('\n').pop())
  } catch {
    result = undefined
  }
  if (result?.ok === true && typeof result.python === 'string' && result.python) return { python: result.python }
  const text = key => (typeof result?.[key] === 'string' ? result[key] : null)
  return { error: text('error'), problem: text('problem') }
}

// How a child process ended, for a log line.
function describe(end) {
  if (end.error !== undefined) return `could not run (${end.error})`
  if (end.signal) return `was ended by ${end.signal}`
  return `exited with ${end.code}`
}

export function messageOf(err) {
  return err instanceof Error ? err.message : String(err)
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
