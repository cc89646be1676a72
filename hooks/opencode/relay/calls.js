// The daemon's calls, carried onto opencode's own server API (the plugin's
// in-process `client`) in the session lich drives. docs/opencode.md has
// what each does there, and its limits.

import { NO_OVERRIDES } from '../../bridge.js'
import { answer, describeError } from './sessions.js'

// opencode's abort answers at once; the turn is over when the session says idle.
const ABORT_SETTLE_MS = 5000

export class Calls {
  constructor({ client, bridge, sessions, log, abortSettleMs = ABORT_SETTLE_MS }) {
    Object.assign(this, { client, bridge, sessions, log, abortSettleMs })
  }

  invoke(method, args) {
    args ??= {}
    switch (method) {
      case 'prompt.submit':
        return this.#prompt(args)
      case 'turn.abort':
        return this.#abort(args)
      case 'command.run':
        return this.#command(args)
      case 'model.fork':
        return this.#fork(args)
      case 'overrides.set':
        return this.#setOverrides(args)
      default:
        throw new Error(`this relay has no method ${method}`)
    }
  }

  // `asUser` has no meaning here: every prompt opencode takes is the user's.
  async #prompt({ text }) {
    const session = await this.sessions.target()
    // Answers once the prompt is admitted; one sent while busy joins the
    // running turn at its next step.
    await answer(this.client.session.promptAsync({ path: { id: session }, body: { parts: [{ type: 'text', text }] } }), 'take the prompt')
    return null
  }

  async #abort({ turnId }) {
    const turn = this.sessions.turn
    if (turn === null || turn.id !== turnId) throw new Error(`${turnId} is not the running turn`)
    // abort answers true even for an idle session: ask first.
    const statuses = await answer(this.client.session.status({}), 'tell the session status')
    if (!statuses?.[turn.session] || statuses[turn.session].type === 'idle') throw new Error('no turn is running')
    await answer(this.client.session.abort({ path: { id: turn.session } }), 'abort the turn')
    if (!(await this.sessions.idle(turn.session, this.abortSettleMs))) {
      throw new Error(`opencode took the abort of ${turnId}, but its session was still busy ${this.abortSettleMs / 1000} s later`)
    }
    return null
  }

  async #command({ command, args }) {
    const known = (await answer(this.client.command.list({}), 'list its commands')) ?? []
    if (!known.some(c => c.name === command)) {
      const names = known.map(c => c.name).join(', ') || 'none'
      throw new Error(`opencode has no command /${command} that its API can run (it has: ${names})`)
    }
    const session = await this.sessions.target()
    // As in Claude Code, a command waits for the running turn to end
    // instead of joining it; opencode answers once the command's turn ended.
    await this.sessions.idle(session)
    await answer(this.client.session.command({ path: { id: session }, body: { command, arguments: args ?? '' } }), `run /${command}`)
    return null
  }

  // The ask: a copy of the session answers, tools off, and is deleted; the
  // session itself, and any turn running in it, never see it.
  async #fork({ prompt }) {
    const session = this.sessions.chosen
    if (session === null) return { isAnswered: false, reason: 'nothing-to-fork' }
    const fork = await answer(this.client.session.fork({ path: { id: session }, body: {} }), 'fork the session')
    this.sessions.forks.add(fork.id)
    try {
      const reply = await answer(
        this.client.session.prompt({ path: { id: fork.id }, body: { tools: { '*': false }, parts: [{ type: 'text', text: prompt }] } }),
        'answer in the fork',
      )
      return forkReply(reply)
    } finally {
      const gone = await this.client.session.delete({ path: { id: fork.id } }).catch(err => ({ error: err }))
      if (gone?.error) this.log('warn', `could not delete its fork ${fork.id}: ${describeError(gone.error)}`)
      this.sessions.forks.delete(fork.id)
    }
  }

  // Both at once, each checked against what opencode has: a model it does
  // not know, or an effort the model has no variant for, is refused. The
  // hooks apply them (the model as {providerID, modelID}).
  async #setOverrides({ model = null, effort = null }) {
    if (model === null && effort === null) {
      this.bridge.overrides = NO_OVERRIDES
      return null
    }
    const { providers = [] } = (await answer(this.client.config.providers({}), 'list its models')) ?? {}
    const wanted = model === null ? null : findModel(providers, model)
    if (effort !== null) {
      const next = wanted ?? this.sessions.lastModel ?? (await this.#defaultModel(providers))
      const levels = next && providers.find(p => p.id === next.providerID)?.models?.[next.modelID]?.variants
      if (levels && !levels[effort]) {
        const have = Object.keys(levels).join(', ') || 'none'
        throw new Error(`${next.providerID}/${next.modelID} has no ${effort} effort in opencode (its levels: ${have})`)
      }
    }
    this.bridge.overrides = { model: wanted, effort }
    return null
  }

  async #defaultModel(providers) {
    const config = await answer(this.client.config.get({}), 'read its configuration').catch(() => null)
    return typeof config?.model === 'string' ? findModel(providers, config.model, true) : null
  }
}

// What opencode's reply in the fork means for lich, in $.model.fork's shape.
export function forkReply(reply) {
  const error = reply?.info?.error
  if (error?.name === 'MessageAbortedError') return { isAnswered: false, reason: 'aborted' }
  if (error) return { isAnswered: false, reason: 'api-error', status: error.data?.statusCode ?? null, error: error.name ?? 'unknown' }
  const text = (reply?.parts ?? []).filter(p => p.type === 'text' && !p.synthetic && !p.ignored).map(p => p.text).join('')
  return text.trim() ? { isAnswered: true, text } : { isAnswered: false, reason: 'empty-reply' }
}

// `provider/model`, or a model id only one provider has.
export function findModel(providers, name, quiet = false) {
  const cut = name.indexOf('/')
  const matches = cut > 0
    ? providers.filter(p => p.id === name.slice(0, cut) && p.models?.[name.slice(cut + 1)]).map(p => ({ providerID: p.id, modelID: name.slice(cut + 1) }))
    : providers.filter(p => p.models?.[name]).map(p => ({ providerID: p.id, modelID: name }))
  if (matches.length === 1) return matches[0]
  if (quiet) return null
  if (matches.length > 1) throw new Error(`more than one opencode provider has a model ${name}: name it as ${matches.map(m => `${m.providerID}/${m.modelID}`).join(' or ')}`)
  throw new Error(`opencode has no model ${name} (name it as provider/model; \`opencode models\` lists them)`)
}
