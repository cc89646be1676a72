"""The releases that do not run the mod degrade as the spec says (releases.py,
LICH_LIVE_DEGRADE): 2.1.260 to 2.1.278 load the plugin and skip the mod,
2.1.250 knows an older event set, 2.1.200 ignores `modules`. On each, with
the plugin loaded from a folder inside lich: the session works, lich
refuses to control it with its "no mod has ever polled" message, and
neither the screen nor the debug log shows an error or a warning from the
plugin. make canary runs it too on a new release whose mod did not run,
which releases.py's ranges would say runs mods: the session itself, not
the release's number, shows that no mod polls."""
from claude_world import World, check_answers_and_lich_is_refused
from workspace import PLUGIN_NAME

SESSION = "degrade-1"
WAIT = 30.0


def test_the_session_works_lich_is_refused_and_the_plugin_says_nothing_wrong(degrade_release):
    with World(degrade_release.binary, claude_env=degrade_release.env) as world:
        session = world.session(SESSION, plugin_dir=world.ws.copy_checkout())
        check_answers_and_lich_is_refused(world, session, "[degrade]", WAIT)

        debug = session.debug_text().splitlines()
        assert any(PLUGIN_NAME in line for line in debug), "the debug log never names the plugin: was it loaded?"
        said = [line for line in debug if PLUGIN_NAME in line and ("[ERROR]" in line or "[WARN]" in line)]
        assert said == [], said
        assert session.exit() == 0
        assert PLUGIN_NAME not in session.terminal.text, session.terminal.text[-2000:]
