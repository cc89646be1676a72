// The relay of the bridge, protocol 1: the lich_control daemon does the
// contract; this module only starts it, carries its calls onto `$`, posts
// back results and turn events, and applies its overrides to every request.
// Only a mod reaches `$`, so this half has to live inside Claude Code.

const RESTARTS = 5
const FIRST_DELAY_MS = 1000
// A daemon that ran this long before it died earns a fresh restart budget.
const HEALTHY_MS = 60_000
// Exit 2: the daemon refused its configuration (bridge.md); a restart cannot mend that.
const CONFIG_ERROR = 2
const NO_OVERRIDES = { model: null, effort: null }
// Builds the daemon's private Python environment and names its interpreter
// (the script's own docstring has the protocol); run with the system's python3.
const SETUP = 'hooks/lich_runtime.py'
// lich's own plugin polls lich for its session itself from this release on.
const LICH_PLUGIN = 'lich'
const LICH_PLUGIN_POLLS_SINCE = [0, 15, 0]

// One decision per loaded module, however often session.start fires.
let claimed = false
let overrides = NO_OVERRIDES
// The main loop's running turn, and the daemon life it was sent to, so that
// a restarted daemon hears of it once.
let mainTurn = null
let mainTurnSentTo = null
// Settles with the running daemon's socket once its hello arrives, or with
// null once it is known that no daemon will run (again): outside lich,
// events then drain at once instead of piling up behind a hello that
// never comes.
let daemon = deferred()
// The tail of the event chain: each event is posted once the one before it
// settled, so the daemon sees them in the order the hooks fired.
let events = Promise.resolve()

/** @type {import('claude-code').Register} */
export function register(on) {
  on('session.start', async ($, e, next) => {
    const started = await next(e)
    if (!claimed) {
      claimed = true
      void supervise($, e.isInteractive)
    }
    return started
  })

  // Only the main loop's turn can be aborted with $.turn.abort.
  on('turn.start', async ($, e, next) => {
    if (e.agentId === undefined) {
      mainTurn = e.turnId
      mainTurnSentTo = daemon
      forward($, 'turn.start', e.turnId)
    }
    return next(e)
  })

  // Every end goes over: the daemon ignores the ends of turns it did not record.
  on('turn.complete', async ($, e, next) => {
    if (e.turnId === mainTurn) mainTurn = null
    forward($, 'turn.complete', e.turnId)
    return next(e)
  })

  // Applied here from memory, so no model request waits on a round trip.
  on('turn.step', async function* ($, e, next) {
    return yield* next(withOverrides(e))
  })
}

// Runs off the hook's back: the session goes on, turns included, while an
// environment is built, and the daemon starts when it is ready.
async function supervise($, isInteractive) {
  if (isInteractive && (await insideLich($)) && !(await lichPluginPolls($))) {
    // The variables a command hook gets (CLAUDE_PID, CLAUDE_PLUGIN_DATA, ...),
    // which spawn does not set by itself.
    const env = await $.process.hookEnv().catch(() => undefined)
    const python = (await namedPython($)) ?? (await setUp($, env))
    if (python !== null) {
      // Every command the session runs after inherits it: bin/lich-mod-status
      // on its PATH finds the daemon's interpreter there.
      await $.env.set('LICH_CONTROL_PYTHON', python).catch(() => undefined)
      await keepRunning($, python, env)
    }
  }
  daemon.settle(null)
}

// A `claude -p` run from a tool inside a lich session inherits its variables:
// isInteractive is what keeps it from taking the parent's commands.
async function insideLich($) {
  // Read one by one: $.env.get takes the name as a literal.
  const port = await $.env.get('LICH_PORT').catch(() => undefined)
  const token = await $.env.get('LICH_TOKEN').catch(() => undefined)
  const session = await $.env.get('LICH_SESSION_ID').catch(() => undefined)
  // The token is only looked at, never kept: the daemon reads it from the
  // environment it inherits from the host.
  return Boolean(port && token && session)
}

// lich's own plugin (lich-plugin) carries a client of this same contract from
// 0.15 on. Two clients would poll lich for one session and split its commands
// between them, so where the loaded plugins show one, this one stands down.
// It is found as lich installs it (enabledPlugins, then the install record
// for its version); one loaded from a folder (--plugin-dir) is not seen.
async function lichPluginPolls($) {
  const enabled = await $.settings.read({ key: 'enabledPlugins' }).catch(() => undefined)
  const ids = Object.keys(enabled ?? {}).filter(id => id.startsWith(`${LICH_PLUGIN}@`) && enabled[id] === true)
  if (ids.length === 0) return false
  const versions = await installedVersions($)
  for (const id of ids) {
    const version = versions[id]
    if (version === undefined) {
      log($, `lich-control: ${id} is enabled too, and its version could not be read; from 0.15.0 on it polls lich for this session itself, and two clients split lich's commands between them (docs/install.md, "Next to lich-plugin")`)
    } else if (atLeast(version, LICH_PLUGIN_POLLS_SINCE)) {
      log($, `lich-control: ${id} ${version} polls lich for this session itself; lich-control starts no daemon here, so the two do not split lich's commands (docs/install.md, "Next to lich-plugin")`)
      return true
    }
  }
  return false
}

// Each installed plugin's version, from Claude Code's install record; {}
// when it cannot be read.
async function installedVersions($) {
  try {
    const configDir = (await $.env.get('CLAUDE_CONFIG_DIR')) || `${await $.env.get('HOME')}/.claude`
    const record = JSON.parse(await $.fs.read(`${configDir}/plugins/installed_plugins.json`))
    const versions = {}
    for (const [id, installs] of Object.entries(record?.plugins ?? {})) {
      const version = Array.isArray(installs) ? installs.find(install => install?.version)?.version : undefined
      if (typeof version === 'string') versions[id] = version
    }
    return versions
  } catch {
    return {}
  }
}

function atLeast(version, [major, minor, patch]) {
  const parts = /^(\d+)\.(\d+)\.(\d+)/.exec(version)
  if (!parts) return false
  const [a, b, c] = parts.slice(1).map(Number)
  return a !== major ? a > major : b !== minor ? b > minor : c >= patch
}

// The `python` option, where Claude Code keeps plugin options: `pluginConfigs`
// in the user's settings, `--settings` or managed settings (never a project's,
// which a cloned repository could use to run a program of its choosing).
// plugin.json does not declare it: Claude Code reports every declared option
// without a stored value as "not yet set" at install, default or not, and
// this one needs none. Null when none names an interpreter.
async function namedPython($) {
  for (const source of ['policy', 'flag', 'user']) {
    const settings = await $.settings.read({ source }).catch(() => undefined)
    for (const [key, config] of Object.entries(settings?.pluginConfigs ?? {})) {
      if (key !== $.plugin.name && !key.startsWith(`${$.plugin.name}@`)) continue
      const python = config?.options?.python
      if (typeof python === 'string' && python.trim()) return python.trim()
    }
  }
  return null
}

// Runs the setup script once, to its end, with the system's python3: each
// line it writes on stderr is a step for the log, its last line on stdout
// the result. The interpreter it names, or null after logging the one line
// that says why there is none. Never throws.
async function setUp($, env) {
  let stdout = ''
  let pending = ''
  let end
  try {
    const child = $.process.spawn({ argv: ['python3', `${$.plugin.root}/${SETUP}`], cwd: $.plugin.root, ...(env && { env }) })
    for await (const { stream, text } of child) {
      if (stream === 'stdout') {
        stdout += text
        continue
      }
      const lines = (pending + text).split('\n')
      pending = lines.pop()
      for (const line of lines) if (line.trim()) log($, `lich-control setup: ${line.trimEnd()}`)
    }
    end = await child.result
  } catch (err) {
    log($, `lich-control cannot set up its Python environment: python3 did not run (${messageOf(err)}). Install Python 3.9 or later, or set the plugin's python option to an interpreter that has lich-control installed (docs/install.md)`)
    return null
  }
  if (pending.trim()) log($, `lich-control setup: ${pending.trimEnd()}`)
  let result
  try {
    result = JSON.parse(stdout.trim().split('\n').pop())
  } catch {
    result = undefined
  }
  if (result?.ok === true && typeof result.python === 'string' && result.python) return result.python
  log($, typeof result?.error === 'string'
    ? result.error
    : `lich-control cannot set up its Python environment: ${SETUP} ${describe(end)} without a result (the lines above say why). Set the plugin's python option to an interpreter that has lich-control installed (docs/install.md)`)
  return null
}

async function keepRunning($, python, env) {
  const request = {
    argv: [python, '-m', 'lich_control.daemon'],
    cwd: $.plugin.root,
    ...(env && { env }),
  }
  let restarts = 0
  for (;;) {
    const began = await now($)
    const end = await run($, request)
    // Its socket went with it: what comes next waits for the next hello. The
    // overrides it set go too: the next daemon starts with none, as lich
    // hears from it.
    if (daemon.value !== undefined) daemon = deferred()
    overrides = NO_OVERRIDES
    if (end.code === 0) return
    if (end.code === CONFIG_ERROR) {
      log($, `lich_control daemon ${describe(end)}: its configuration is wrong; not restarting it`)
      return
    }
    const ended = await now($)
    if (began !== undefined && ended !== undefined && ended - began >= HEALTHY_MS) restarts = 0
    if (restarts === RESTARTS) {
      log($, `lich_control daemon ${describe(end)}; not restarting it again`)
      return
    }
    const delay = FIRST_DELAY_MS * 2 ** restarts
    restarts += 1
    log($, `lich_control daemon ${describe(end)}; restart ${restarts} of ${RESTARTS} in ${delay} ms`)
    await $.clock.sleep(delay).catch(() => undefined)
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

// Runs the daemon once, to its end; never throws.
async function run($, request) {
  let pending = ''
  try {
    const child = $.process.spawn(request)
    for await (const { stream, text } of child) {
      if (stream === 'stderr') {
        log($, text.trimEnd())
        continue
      }
      // A piece ends wherever the daemon's write did: keep the unfinished tail.
      const lines = (pending + text).split('\n')
      pending = lines.pop()
      for (const line of lines) if (line.trim()) receive($, line)
    }
    return await child.result
  } catch (err) {
    return { code: null, signal: null, error: messageOf(err) }
  }
}

function receive($, line) {
  let message
  try {
    message = JSON.parse(line)
  } catch {
    log($, `lich_control daemon wrote a line that is not JSON (${line.length} chars)`)
    return
  }
  // Without a socket path a fetch would go out over TCP: such a hello is no hello.
  if (message?.op === 'hello' && typeof message.socket === 'string' && message.socket) {
    log($, `lich_control daemon ${message.pid} (${message.version}, protocol ${message.protocol}) listens on ${message.socket}`)
    daemon.settle(message.socket)
    // A daemon started mid-turn (a restart) would not know the turn to abort.
    if (mainTurn !== null && mainTurnSentTo !== daemon) {
      mainTurnSentTo = daemon
      forward($, 'turn.start', mainTurn)
    }
  } else if (message?.op === 'call') {
    void perform($, message, daemon)
  } else {
    log($, `lich_control daemon sent an unknown op ${JSON.stringify(message?.op)}`)
  }
}

// Started the moment its line is read and never awaited by the reader, so a
// prompt waiting for an idle session holds up no abort behind it.
async function perform($, { id, method, args }, life) {
  let result
  try {
    result = { id, ok: true, value: (await invoke($, method, args)) ?? null }
  } catch (err) {
    result = { id, ok: false, error: messageOf(err) }
  }
  // Call ids start again with each daemon: a result for one that has ended
  // would settle the next one's call of the same id.
  if (daemon !== life) {
    log($, `lich_control: the daemon that asked for ${id} (${method}) has ended; its result is dropped`)
    return
  }
  await post($, '/v1/result', result)
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
      overrides = { model: args?.model ?? null, effort: args?.effort ?? null }
      return null
    default:
      throw new Error(`this relay has no method ${method}`)
  }
}

function forward($, event, turnId) {
  events = postAfter($, events, { event, turnId })
}

async function postAfter($, previous, body) {
  await previous
  await post($, '/v1/event', body)
}

// Waits for the daemon's socket, then posts; never throws.
async function post($, path, body) {
  const socketPath = await daemon.promise
  if (socketPath === null) return
  try {
    const response = await $.http.fetch(`http://lich-control${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      socketPath,
    })
    if (!response.ok) {
      log($, `lich_control daemon answered ${response.status} to ${path}: ${response.text.trim()}`)
    }
  } catch (err) {
    log($, `lich_control daemon unreachable for ${path}: ${messageOf(err)}`)
  }
}

function withOverrides(step) {
  const { model, effort } = overrides
  if (model === null && effort === null) return step
  return {
    ...step,
    ...(model !== null && { model }),
    ...(effort !== null && { effort }),
  }
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

function describe(end) {
  if (end.error !== undefined) return `could not run (${end.error})`
  if (end.signal) return `was ended by ${end.signal}`
  return `exited with ${end.code}`
}

// The debug log alone: what the relay has to say is for whoever debugs it.
function log($, text) {
  try {
    $.ui.log(text, { to: 'debug' })
  } catch {
    // Nothing the relay does may fail a turn, logging included.
  }
}

function messageOf(err) {
  return err instanceof Error ? err.message : String(err)
}
