// The daemon's process as opencode runs it, on the Node APIs its Bun has:
// the setup script that names the daemon's Python, the daemon itself, and a
// post to it. The rest of the bridge, the same for both relays, is
// ../../bridge.js.

import { request } from 'node:http'
import { dirname, join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

import { SECRET_HEADER, describe, setupResult, messageOf } from '../../bridge.js'

// The project's folder: the daemon's package, and the setup script.
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')
// Builds the daemon's private Python environment and names its interpreter,
// as for the Claude Code relay (its docstring has the protocol); run with the
// system's Python: python3, or on Windows, which has none, the py launcher,
// else a python on PATH.
const SETUP = join(ROOT, 'hooks', 'lich_runtime.py')
export const SYSTEM_PYTHONS = { posix: [['python3']], win32: [['py', '-3'], ['python']] }

// Runs hooks/lich_runtime.py to its end with the first of `pythons` (argv
// heads) that runs, its steps to the log: the interpreter it names, or null
// once the one line that says why there is none is logged. Never throws.
export async function setUp(launch, data, log, pythons) {
  let stdout = ''
  let end
  const failures = []
  for (const [command, ...head] of pythons) {
    end = await runChild(launch, command, [...head, SETUP, '--data', data], ['ignore', 'pipe', 'pipe'], child => {
      child.stdout.setEncoding('utf8').on('data', text => (stdout += text))
      eachLine(child.stderr, line => log('info', `setup: ${line}`))
    })
    if (end.error === undefined) break
    failures.push(pythons.length > 1 ? `${[command, ...head].join(' ')}: ${end.error}` : end.error)
  }
  if (end.error !== undefined) {
    const names = pythons.map(python => python.join(' ')).join(' nor ')
    log('error', `cannot set up its Python environment: ${names} did not run (${failures.join('; ')}). Install Python 3.9 or later, or name an interpreter that has lich-control installed in the plugin's python option (docs/opencode.md)`)
    return null
  }
  const { python, error } = setupResult(stdout)
  if (python) return python
  log('error', error ?? `cannot set up its Python environment: hooks/lich_runtime.py ${describe(end)} without a result (the lines above say why)`)
  return null
}

// Runs the daemon once, to its end, each line it writes on stdout to
// `onLine`; `started` gets the process, to stop it with. Never throws.
export function runDaemon(launch, python, { onLine, log, started }) {
  // stdin stays open and unused: the daemon stops when it closes. It checks
  // that its parent is the process named here, so an opencode gone before
  // the daemon's interpreter started is noticed.
  const env = { ...process.env, LICH_CONTROL_PARENT_PID: String(process.pid) }
  return runChild(launch, python, ['-m', 'lich_control', '--host', 'opencode'], ['pipe', 'pipe', 'pipe'], child => {
    started(child)
    eachLine(child.stdout, onLine)
    eachLine(child.stderr, line => log('info', line))
  }, env)
}

// One request to the daemon (bridge.md) at its hello's address: its Unix
// socket, or its loopback port with its secret; resolves with its answer.
export function postToDaemon({ socket, port, secret }, path, body) {
  return new Promise((done, fail) => {
    const payload = JSON.stringify(body)
    const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), ...(secret !== undefined && { [SECRET_HEADER]: secret }) }
    const where = socket !== undefined ? { socketPath: socket } : { host: '127.0.0.1', port }
    const req = request({ ...where, path, method: 'POST', headers }, res => {
      let text = ''
      res.setEncoding('utf8').on('data', chunk => (text += chunk)).on('end', () => done({ status: res.statusCode, text }))
    })
    req.on('error', fail)
    req.end(payload)
  })
}

// Starts a child in the project's folder, with opencode's environment (the
// LICH_* variables included) unless given another, and resolves how it
// ended: {code, signal}, or {error} when it could not run.
function runChild(launch, command, args, stdio, attach, env = process.env) {
  return new Promise(done => {
    let child
    try {
      child = launch(command, args, { cwd: ROOT, env, stdio })
    } catch (err) {
      done({ error: messageOf(err) })
      return
    }
    child.on('error', err => done({ error: messageOf(err) }))
    child.on('close', (code, signal) => done({ code, signal }))
    attach(child)
  })
}

function eachLine(stream, onLine) {
  createInterface({ input: stream }).on('line', line => line.trim() && onLine(line))
}
