// What Claude Code's plugin records say to the Claude Code relay
// (mod-control.js): where each plugin is installed, this plugin's data
// folder, the python option, and whether lich's own plugin polls lich for
// the session itself. Read through `claude`, the relay's calls of `$` (a
// loader follows `$` into no other file, so they are spelled there):
//   settings(source)      $.settings.read({ source }); no source: the whole merge
//   exists(path), read(path)  $.fs.exists, $.fs.read
//   folders()             {home, cache, config}: HOME, CLAUDE_CODE_PLUGIN_CACHE_DIR
//                         and CLAUDE_CONFIG_DIR
//   plugin                {name, root}: this plugin's, as $.plugin has them

// lich's own plugin, by the name it installs under (lich@<marketplace>).
const LICH_PLUGIN = 'lich'

// The folder Claude Code keeps for this plugin's data, as it names it:
// data/<plugin id> in its plugins folder, every character of the id but
// letters, digits, - and _ made -. The id is the install record's: the one
// whose copy is this plugin's folder, else the only one of this name (a
// marketplace added from a folder runs the plugin there, not from its
// copy); with none, <name>@inline, a folder loaded with --plugin-dir.
export async function dataFolder(claude) {
  try {
    const plugins = await pluginsFolder(claude)
    const installs = await installPaths(claude)
    const ids = Object.keys(installs).filter(key => key.startsWith(`${claude.plugin.name}@`))
    const id = ids.find(key => installs[key].includes(claude.plugin.root)) ?? (ids.length === 1 ? ids[0] : `${claude.plugin.name}@inline`)
    return `${plugins}/data/${id.replace(/[^a-zA-Z0-9_-]/g, '-')}`
  } catch {
    return undefined
  }
}

// Claude Code's plugins folder, where it keeps the install record and each
// plugin's data: CLAUDE_CODE_PLUGIN_CACHE_DIR when that is set (a leading ~
// is the home folder), else plugins/ in its configuration folder.
async function pluginsFolder(claude) {
  const { home, cache, config } = await claude.folders()
  return cache ? cache.replace(/^~(?=\/|$)/, home) : `${config || `${home}/.claude`}/plugins`
}

// lich's own plugin (lich-plugin) may carry a client of this same contract
// in its mod. Two clients would split the session's commands between them,
// so where an enabled lich-plugin registers a mod, this one stands down.
// What its installed files register decides, not its version (its
// hooks/hooks.json names the mod under `modules`). It is found as lich
// installs it (enabledPlugins, then the install record); one loaded from a
// folder (--plugin-dir) is not seen. {polls}, and the `lines` that say what
// was found, for the debug log.
export async function lichPluginPolls(claude) {
  // The whole merge, and the key from it: every release reads that, where
  // a read of one key is not.
  const enabled = (await claude.settings().catch(() => undefined))?.enabledPlugins
  const ids = Object.keys(enabled ?? {}).filter(id => id.startsWith(`${LICH_PLUGIN}@`) && enabled[id] === true)
  const lines = []
  if (ids.length === 0) return { polls: false, lines }
  const installs = await installPaths(claude)
  for (const id of ids) {
    for (const root of installs[id] ?? [undefined]) {
      const mod = root === undefined ? undefined : await registeredMod(claude, root)
      if (mod === undefined) {
        lines.push(`lich-control: ${id} is enabled too, and what it registers could not be read; a lich-plugin with a mod polls lich for this session itself, and two clients split lich's commands between them (docs/install.md, "Next to lich-plugin")`)
      } else if (mod !== null) {
        lines.push(`lich-control: ${id} registers a mod (${mod}) that polls lich for this session itself; lich-control starts no daemon here, so the two do not split lich's commands (docs/install.md, "Next to lich-plugin")`)
        return { polls: true, lines }
      }
    }
  }
  return { polls: false, lines }
}

// Where each installed plugin's files are, from Claude Code's install
// record in its plugins folder; {} when it cannot be read.
async function installPaths(claude) {
  try {
    const path = `${await pluginsFolder(claude)}/installed_plugins.json`
    // There is none before the first install, and a failed $.fs.read is an
    // [ERROR] line in the debug log.
    if (!(await claude.exists(path))) return {}
    const record = JSON.parse(await claude.read(path))
    const paths = {}
    for (const [id, installs] of Object.entries(record?.plugins ?? {})) {
      const found = Array.isArray(installs) ? installs.map(install => install?.installPath).filter(path => typeof path === 'string') : []
      if (found.length > 0) paths[id] = found
    }
    return paths
  } catch {
    return {}
  }
}

// The mod a plugin's folder registers: the first module its hooks/hooks.json
// names (relative to that file) that is there to load. Null when it
// registers none; undefined when hooks.json cannot be read.
async function registeredMod(claude, root) {
  let hooks
  try {
    hooks = JSON.parse(await claude.read(`${root}/hooks/hooks.json`))
  } catch {
    return undefined
  }
  for (const entry of Array.isArray(hooks?.modules) ? hooks.modules : []) {
    if (typeof entry !== 'string') continue
    const path = `${root}/hooks/${entry.replace(/^\.\//, '')}`
    if (await claude.exists(path).catch(() => false)) return path
  }
  return null
}

// The `python` option: the manifest's userConfig field, which Claude Code
// hands over as `options` (set in /config, or stored under the plugin's key
// in `pluginConfigs` of the user's settings, `--settings` or managed
// settings; never a project's, which a cloned repository could use to run a
// program of its choosing), "" when unset. A value stored under the bare
// name before the field was declared is read from those same settings:
// Claude Code hands an installed plugin only what its full key
// (`lich-control@lich-control`) holds. Null when none names an interpreter.
export async function namedPython(claude, option) {
  if (typeof option === 'string' && option.trim()) return option.trim()
  const sources = await Promise.all(['policy', 'flag', 'user'].map(source => claude.settings(source).catch(() => undefined)))
  for (const settings of sources) {
    for (const [key, config] of Object.entries(settings?.pluginConfigs ?? {})) {
      if (key !== claude.plugin.name && !key.startsWith(`${claude.plugin.name}@`)) continue
      const python = config?.options?.python
      if (typeof python === 'string' && python.trim()) return python.trim()
    }
  }
  return null
}
