// The relay of the bridge, protocol 1: the lich_control daemon does the
// contract; this module only starts it, carries its calls onto `$`, posts
// back results and turn events, and applies its overrides to every request.
// Only a mod reaches `$`, so this half has to live inside Claude Code; what
// does not need `$` is bridge.js, which the opencode relay shares.

import { Bridge, Refused, SETUP, messageOf, postHeaders, setUp, systemPythons } from './bridge.js'
import { dataFolder, lichPluginPolls, namedPython } from './plugin-records.js'

// A Windows path: a drive letter, then a backslash (or a slash).
const WINDOWS_PATH = /^[A-Za-z]:[\\/]/
// Claude Code's platforms ($.session.info) in Node's words, which
// systemPythons takes.
const PLATFORMS = { windows: 'win32', macos: 'darwin', linux: 'linux' }
// Claude Code's words where it refuses a plugin's every $.http.fetch, before
// it reads the URL; a fetch that failed otherwise names its URL before them.
const FETCH_REFUSED = /: \$\.http\.fetch: refused: (.+)$/s
// Its why where CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is the cause.
const NONESSENTIAL = 'nonessential network traffic is disabled'
// A URL the check asks $.http.fetch for: no fetch takes it (not http), so
// where fetches are allowed it is refused for its scheme, with no request
// made and no line in the debug log.
const PROBE = 'lich-control:probe'

// One decision per loaded module, however often session.start fires.
let claimed = false
// The daemon's life and what crosses to it; outside lich it is closed at
// once, and the turn events drain.
const bridge = new Bridge()

/** @type {import('claude-code').Register} */
export function register(on, options) {
  on('session.start', async ($, e, next) => {
    // Before next(e), and not awaited: the daemon's start, a Python
    // interpreter's, overlaps the rest of the session's.
    if (!claimed) {
      claimed = true
      // Nothing that keeps the daemon from starting goes unsaid: a throw
      // here would only reach Claude Code's note of an unawaited rejection.
      void supervise($, e.isInteractive, options?.python).catch(err =>
        log($, `lich-control could not start its daemon, so lich cannot control this session: ${messageOf(err)}`),
      )
    }
    return next(e)
  })

  // Only the main loop's turn can be aborted with $.turn.abort; a
  // subagent's turn.start carries its agentId.
  on('turn.start', async ($, e, next) => {
    if (e.agentId === undefined) bridge.turnStarted(e.turnId)
    return next(e)
  })

  on('turn.complete', async ($, e, next) => {
    bridge.turnEnded(e.turnId)
    return next(e)
  })

  // Applied here from memory, so no model request waits on a round trip.
  on('turn.step', async function* ($, e, next) {
    return yield* next(withOverrides(e))
  })
}

// Runs off the hook's back: the session goes on, turns included, while an
// environment is built, and the daemon starts when it is ready.
async function supervise($, isInteractive, option) {
  try {
    if (!isInteractive || !(await insideLich($))) return
    // Asked all at once: each is a round trip to Claude Code's worker, and
    // the daemon's start waits on the last of them.
    const claude = records($)
    const [platform, lichPlugin, env, named, refusal] = await Promise.all([
      platformOf($),
      lichPluginPolls(claude),
      hookEnv($, claude),
      namedPython(claude, option),
      fetchRefusal($),
    ])
    for (const line of lichPlugin.lines) log($, line)
    if (lichPlugin.polls) return
    // A line an earlier load of this module pinned (before /reload-plugins)
    // stays on screen until replaced: taken away first.
    shown = true
    show($, undefined)
    // Its results could never reach it: a daemon would take lich's commands
    // and never ack them.
    if (refusal !== undefined) return refused($, refusal)
    const python = named ?? (await setUpPython($, env, systemPythons(platform)))
    if (python === null) return
    // Every command the session runs after inherits it: bin/lich-mod-status
    // on its PATH finds the daemon's interpreter there.
    await $.env.set('LICH_CONTROL_PYTHON', python).catch(() => undefined)
    // A setup's line goes once the daemon is up (its hello; it polls at
    // once), or once it is known none will be.
    if (shown) void bridge.daemon.promise.then(() => show($, undefined))
    await bridge.serve(host($, python, env))
    // Refused once the daemon ran (its env changed in the settings, a
    // policy read late): it was ended, and that is said.
    if (bridge.refusal !== undefined) refused($, bridge.refusal)
  } finally {
    bridge.close()
  }
}

// Which release has which `$` call: docs/install.md, "Which Claude Code".
// A call a release lacks throws a TypeError at once, before any promise
// exists, and the loader refuses a module that looks a call up (`typeof`),
// so making the call is the check: `present` answers what it resolves, or
// LACKING where the call threw that way.
const LACKING = Symbol('a call this Claude Code lacks')

function present(call) {
  try {
    return Promise.resolve(call())
  } catch (err) {
    return err instanceof TypeError ? Promise.resolve(LACKING) : Promise.reject(err)
  }
}

// The variables a command hook gets (CLAUDE_PID, CLAUDE_PLUGIN_DATA, ...),
// which spawn does not set by itself. Without $.process.hookEnv the relay
// names the plugin's data folder itself, for the setup script, and the
// daemon, named no parent, takes the one it finds as it starts. Undefined
// when Claude Code could not give them.
async function hookEnv($, claude) {
  const env = await present(() => $.process.hookEnv()).catch(() => undefined)
  if (env !== LACKING) return env
  const data = await dataFolder(claude)
  return data === undefined ? undefined : { CLAUDE_PLUGIN_DATA: data }
}

// The calls plugin-records.js reads Claude Code's records with: a loader
// follows `$` into no function of another file, so they are spelled here.
function records($) {
  return {
    settings: source => (source === undefined ? $.settings.read() : $.settings.read({ source })),
    exists: path => $.fs.exists(path),
    read: path => $.fs.read(path),
    // One call a name: $.env.get takes the name as a literal.
    folders: async () => ({
      home: await $.env.get('HOME'),
      cache: await $.env.get('CLAUDE_CODE_PLUGIN_CACHE_DIR'),
      config: await $.env.get('CLAUDE_CONFIG_DIR'),
    }),
    plugin: { name: $.plugin.name, root: $.plugin.root },
  }
}

// A `claude -p` run from a tool inside a lich session inherits its variables:
// isInteractive is what keeps it from taking the parent's commands.
async function insideLich($) {
  // One call a name: $.env.get takes the name as a literal.
  const [port, token, session] = await Promise.all([
    $.env.get('LICH_PORT').catch(() => undefined),
    $.env.get('LICH_TOKEN').catch(() => undefined),
    $.env.get('LICH_SESSION_ID').catch(() => undefined),
  ])
  // The token is only looked at, never kept: the daemon reads it from the
  // environment it inherits from the host.
  return Boolean(port && token && session)
}

// Why Claude Code refuses this plugin's every $.http.fetch, and with them
// the relay's posts to its daemon, in its own words; undefined where it
// does not. The call is asked, not the variable: the settings' env can set
// it too, and an organization's policy can refuse as well.
async function fetchRefusal($) {
  try {
    await $.http.fetch(PROBE)
  } catch (err) {
    return FETCH_REFUSED.exec(messageOf(err))?.[1]
  }
  return undefined
}

// No daemon runs, said in the debug log and on screen in one row: the
// cause, and what mends it.
function refused($, reason) {
  const traffic = reason.includes(NONESSENTIAL)
  const mend = 'unset CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC or update Claude Code to 2.1.288 or later, then restart claude'
  log($, `lich-control runs no daemon, so lich cannot control this session: Claude Code refuses the plugin's requests to it (${reason})${traffic ? `; ${mend}` : ''} (docs/install.md, "Nonessential traffic, before 2.1.288")`)
  show($, traffic
    ? 'no lich control while CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set: unset it or update Claude Code to 2.1.288+, then restart claude'
    : `lich cannot control this session: Claude Code refuses the plugin's requests (${reason})`)
}

// The platform Claude Code runs on, in Node's words: the system's Python
// has another name on Windows. Without $.session.info the plugin's own
// folder tells Windows, whose paths alone start with a drive letter (under
// WSL, Linux to the daemon, it is a Linux path); undefined: a POSIX one.
async function platformOf($) {
  const info = await present(() => $.session.info()).catch(() => undefined)
  if (info !== LACKING) return PLATFORMS[info?.platform]
  return WINDOWS_PATH.test($.plugin.root) ? 'win32' : undefined
}

// bridge.js's setUp on `$`: each line the setup writes on stderr is a step
// for the debug log, and its first on stdout, when it builds, says so
// ({"building": ...}) on screen. The interpreter it names, or null once
// the log and the screen say why there is none. Never throws.
async function setUpPython($, env, pythons) {
  const steps = lineReader(line => log($, `lich-control setup: ${line.trimEnd()}`))
  const told = lineReader(line => {
    if (!shown && line.includes('"building"')) show($, 'setting up Python for lich (first run)…')
  })
  const result = await setUp(async python => {
    let stdout = ''
    try {
      const child = $.process.spawn({ argv: [...python, `${$.plugin.root}/${SETUP}`], cwd: $.plugin.root, ...(env && { env }) })
      for await (const { stream, text } of child) {
        if (stream === 'stdout') {
          stdout += text
          told.push(text)
        } else steps.push(text)
      }
      const end = await child.result
      steps.end()
      return { end, stdout }
    } catch (err) {
      return { error: messageOf(err) }
    }
  }, pythons, 'docs/install.md')
  if (result.python) return result.python
  log($, result.error)
  // The same on screen, in one row: the cause, and what tries again in this
  // session (/reload-plugins runs the setup again and starts the daemon).
  // The command that does it from a shell is too long for the row:
  // lich-mod-status prints it, as does the debug log.
  if (result.noPython) show($, `cannot set up Python for lich: ${result.why}. Install Python 3.9 or later, then /reload-plugins`)
  else if (result.problem) show($, `cannot set up Python for lich: ${result.problem}. Mend that, then /reload-plugins`)
  else show($, `cannot set up Python for lich: ${result.why} (claude --debug logs its steps). /reload-plugins tries again`)
  return null
}

// The relay's one line on the person's screen, under the prompt, after the
// plugin's name (Claude Code adds it): the setup at work, then its failure;
// cleared once the daemon is up. Pinned with $.ui.status; where it is
// lacking, a line in the transcript, which cannot be taken back (a toast
// would be gone in seconds, and $.ui.notify leaves the terminal). Nothing
// is shown outside lich, or where the daemon starts at once.
let shown = false

function show($, text) {
  if (text === undefined && !shown) return
  shown = text !== undefined
  present(() => $.ui.status(text))
    .then(done => {
      if (done === LACKING && text !== undefined) $.ui.log(`lich-control: ${text}`)
    })
    .catch(() => undefined)
}

// What the bridge needs of Claude Code to run the daemon and serve it.
function host($, python, env) {
  // The daemon checks that its parent is the process named here, so a
  // Claude Code gone before the daemon's interpreter started is noticed. A
  // mod has no `process`: CLAUDE_PID names the engine, which spawns the child.
  const daemonEnv = env?.CLAUDE_PID ? { ...env, LICH_CONTROL_PARENT_PID: env.CLAUDE_PID } : env
  const request = { argv: [python, '-m', 'lich_control'], cwd: $.plugin.root, ...(daemonEnv && { env: daemonEnv }) }
  return {
    run: (onLine, signal) => run($, request, onLine, signal),
    invoke: (method, args) => invoke($, method, args),
    send: (address, path, body) => send($, address, path, body),
    now: () => now($),
    sleep: ms => $.clock.sleep(ms).catch(() => undefined),
    log: (level, text) => log($, `lich-control: ${text}`),
  }
}

// The host's clock, or undefined: a failed read only skips the budget refill.
async function now($) {
  try {
    return await $.clock.now()
  } catch {
    return undefined
  }
}

// Runs the daemon once, to its end, or until `signal` aborts; never throws.
// The loop is the child's life: return() on its stream, even with a pull
// pending (which then ends), has Claude Code send it SIGTERM, and SIGKILL
// 2 s later; its result is then undefined, and how it ended is not told.
async function run($, request, onLine, signal) {
  const lines = lineReader(onLine)
  try {
    const child = $.process.spawn(request)
    const pieces = child[Symbol.asyncIterator]()
    const leave = () => void Promise.resolve(pieces.return()).catch(() => undefined)
    signal.addEventListener('abort', leave, { once: true })
    try {
      for (let piece; !(piece = await pieces.next()).done; ) {
        const { stream, text } = piece.value
        if (stream === 'stderr') log($, text.trimEnd())
        else lines.push(text)
      }
    } finally {
      signal.removeEventListener('abort', leave)
    }
    return signal.aborted ? { code: null, signal: null } : await child.result
  } catch (err) {
    return { code: null, signal: null, error: messageOf(err) }
  }
}

// A child's output as lines: a piece ends wherever the child's write did, so
// the unfinished tail waits for the next piece, or for end().
function lineReader(onLine) {
  let pending = ''
  return {
    push(text) {
      const lines = (pending + text).split('\n')
      pending = lines.pop()
      for (const line of lines) if (line.trim()) onLine(line)
    },
    end() {
      if (pending.trim()) onLine(pending)
    },
  }
}

// $ is spelled out call by call: the loader reads what the module calls off
// its source, so no method name is looked up at run time.
async function invoke($, method, args) {
  switch (method) {
    case 'prompt.submit':
      return $.prompt.submit(args)
    case 'turn.abort':
      return $.turn.abort(args)
    case 'command.run':
      return $.command.run(args)
    case 'model.fork':
      return $.model.fork(args)
    case 'overrides.set':
      bridge.overrides = { model: args?.model ?? null, effort: args?.effort ?? null }
      return null
    default:
      throw new Error(`this relay has no method ${method}`)
  }
}

// To the daemon's Unix socket, or on Windows to its loopback port with its
// secret (bridge.js, the address).
async function send($, address, path, body) {
  const { socket, port } = address
  const headers = postHeaders(address)
  const url = socket === undefined ? `http://127.0.0.1:${port}${path}` : `http://lich-control${path}`
  let response
  try {
    response = await $.http.fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify(body),
      ...(socket !== undefined && { socketPath: socket }),
    })
  } catch (err) {
    const reason = FETCH_REFUSED.exec(messageOf(err))?.[1]
    throw reason === undefined ? err : new Refused(reason)
  }
  return { status: response.status, text: response.text }
}

function withOverrides(step) {
  const { model, effort } = bridge.overrides
  if (model === null && effort === null) return step
  return {
    ...step,
    ...(model !== null && { model }),
    ...(effort !== null && { effort }),
  }
}

// The debug log alone: what the relay has to say is for whoever debugs it.
function log($, text) {
  try {
    $.ui.log(text, { to: 'debug' })
  } catch {
    // Nothing the relay does may fail a turn, logging included.
  }
}
