// Which opencode session lich drives, and its turns, as opencode's bus and
// hooks tell them (docs/opencode.md, "Which session lich drives"): the root
// session this process last prompted, or, before any, one made for lich.
// Turn ids are the relay's own, one per busy -> idle of that session.

// opencode's TUI takes a select only once it listens to the bus, which can
// be seconds after the plugin is loaded (its screen starts after the server
// does), and drops one published before; nothing in opencode acknowledges a
// select. So it is published again each second, up to SHOW_TRIES times, while
// the session is still the one lich drives: selecting the session the TUI
// already shows changes nothing on its screen.
const SHOW_EVERY_MS = 1000
const SHOW_TRIES = 20

export class Sessions {
  constructor({ client, bridge, sleep, log }) {
    Object.assign(this, { client, bridge, sleep, log })
    // All written by the hooks and the calls, on opencode's one thread.
    this.chosen = null // the session lich drives
    this.creating = null // its creation, while lich's first call makes it
    this.parents = new Map() // session id -> parent id, null for a root
    this.forks = new Set() // lich's asks, never driven
    this.busy = new Set()
    this.turn = null // {id, session}: the chosen session's running turn
    this.turns = 0
    this.idleWaiters = []
    this.lastModel = null // the model the chosen session's last prompt asked for
  }

  // The session lich drives, made and shown in the TUI when there is none yet.
  target() {
    if (this.chosen !== null) return Promise.resolve(this.chosen)
    this.creating ??= (async () => {
      try {
        const made = await answer(this.client.session.create({ body: {} }), 'create a session')
        this.parents.set(made.id, null)
        this.#choose(made.id)
        // Shown, so the person sees what lich does there.
        void this.#show(made.id)
        return made.id
      } finally {
        this.creating = null
      }
    })()
    return this.creating
  }

  // Selects the session in the TUI (SHOW_TRIES above says why more than once).
  // Never throws: a TUI that refuses it stays where it is, and the log says why.
  async #show(session) {
    for (let sent = 1; this.chosen === session; sent++) {
      const { error } = await this.client.tui.publish({ body: { type: 'tui.session.select', properties: { sessionID: session } } }).catch(err => ({ error: err }))
      if (error !== undefined && error !== null) {
        this.log('warn', `opencode's TUI could not be told to show lich's session ${session}: ${describeError(error)}`)
        return
      }
      if (sent === SHOW_TRIES) return
      await this.sleep(SHOW_EVERY_MS)
    }
  }

  // A user message as opencode creates it (`chat.message`): a root session's
  // makes it the one lich drives.
  async prompted(session, message) {
    if (!this.forks.has(session) && (await this.#isRoot(session))) {
      this.#choose(session)
      this.lastModel = pick(message?.model)
    }
  }

  // An event of opencode's bus.
  observe(event) {
    const props = event?.properties ?? {}
    switch (event?.type) {
      case 'session.created':
      case 'session.updated':
        if (props.info?.id) this.parents.set(props.info.id, props.info.parentID ?? null)
        break
      case 'session.deleted':
        if (props.info?.id === this.chosen) this.#choose(null)
        break
      case 'session.status': {
        if (props.status?.type === 'idle') this.busy.delete(props.sessionID)
        else if (props.status?.type) this.busy.add(props.sessionID)
        if (props.sessionID === this.chosen) this.#settleTurn()
        const waiting = this.idleWaiters
        this.idleWaiters = waiting.filter(w => this.busy.has(w.session))
        for (const w of waiting) if (!this.busy.has(w.session)) w.wake(true)
        break
      }
    }
  }

  // True once the session is idle; false when `ms` ran out first.
  idle(session, ms) {
    if (!this.busy.has(session)) return Promise.resolve(true)
    return new Promise(wake => {
      this.idleWaiters.push({ session, wake })
      if (ms !== undefined) void this.sleep(ms).then(() => wake(false))
    })
  }

  async #isRoot(session) {
    if (!this.parents.has(session)) {
      const info = await answer(this.client.session.get({ path: { id: session } }), 'describe the session').catch(() => null)
      if (info) this.parents.set(session, info.parentID ?? null)
    }
    return this.parents.get(session) === null
  }

  #choose(session) {
    if (session === this.chosen) return
    this.chosen = session
    if (session !== null) this.lastModel = null
    this.#settleTurn()
  }

  #settleTurn() {
    const busy = this.chosen !== null && this.busy.has(this.chosen)
    if (this.turn !== null && (!busy || this.turn.session !== this.chosen)) {
      this.bridge.turnEnded(this.turn.id)
      this.turn = null
    }
    if (busy && this.turn === null) {
      this.turn = { id: `o${++this.turns}`, session: this.chosen }
      this.bridge.turnStarted(this.turn.id)
    }
  }
}

// An SDK call's data, or an Error that says what opencode refused.
export async function answer(pending, what) {
  const { data, error } = await pending
  if (error !== undefined && error !== null) throw new Error(`opencode could not ${what}: ${describeError(error)}`)
  return data
}

export function describeError(error) {
  const text = error?.data?.message ?? error?.message ?? (typeof error === 'string' ? error : JSON.stringify(error))
  return String(text).slice(0, 300)
}

function pick(model) {
  return model?.providerID && model?.modelID ? { providerID: model.providerID, modelID: model.modelID } : null
}
