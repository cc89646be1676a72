// The daemon's process as opencode runs it, on the Node APIs its Bun has:
// the setup script that names the daemon's Python, the daemon itself, and a
// post to it. The rest of the bridge, the same for both relays, is
// ../../bridge.js.

import { request } from 'node:http'
import { dirname, join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

import { SETUP, messageOf, postHeaders, setUp } from '../../bridge.js'

// The project's folder: the daemon's package, and the setup script.
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')

// bridge.js's setUp, each try a child process in the project's folder, its
// steps to the log; the environment goes to `data` (opencode keeps no
// folder per plugin). The interpreter it names, or null once the one line
// that says why there is none is logged. Never throws.
export async function setUpPython(launch, data, log, pythons) {
  const result = await setUp(async ([command, ...head]) => {
    let stdout = ''
    const end = await runChild(launch, command, [...head, join(ROOT, SETUP), '--data', data], ['ignore', 'pipe', 'pipe'], child => {
      child.stdout.setEncoding('utf8').on('data', text => (stdout += text))
      eachLine(child.stderr, line => log('info', `setup: ${line}`))
    })
    return end.error === undefined ? { end, stdout } : { error: end.error }
  }, pythons, 'docs/opencode.md')
  if (result.python) return result.python
  log('error', result.error)
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
    const headers = { ...postHeaders({ secret }), 'content-length': Buffer.byteLength(payload) }
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
