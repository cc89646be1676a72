"""hooks/lich_package.py: what the environment is made of, and what pip's output means."""
import os

import pytest

from setup_plugin import make_plugin, write

import lich_package as package  # noqa: I100 (from the hooks folder setup_plugin puts on the path)


@pytest.fixture
def plugin(tmp_path):
    return make_plugin(str(tmp_path / "plugin"))


def test_the_key_follows_the_package_and_the_version_not_the_rest_of_the_folder(plugin):
    first = plugin.key()
    assert first.startswith("0.1.0-")
    write(os.path.join(plugin.root, "docs", "install.md"), "edited\n")
    write(os.path.join(plugin.root, "README.md"), "edited\n")
    assert plugin.key() == first
    write(os.path.join(plugin.root, "lich_control", "__init__.py"), "VALUE = 2\n")
    assert plugin.key() != first
    make_plugin(plugin.root, version="0.2.0", code="VALUE = 2\n")
    assert plugin.key().startswith("0.2.0-")



@pytest.mark.parametrize("output, problem", [
    ("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(...)'\n"
     "ERROR: No matching distribution found for attrs>=22.2\n",
     "the package index could not be reached"),
    ("ERROR: Could not find a version that satisfies the requirement setuptools>=61 (from versions: none)\n",
     "setuptools>=61 is not on the package index, or none there fits this Python"),
    ("Processing ./lich-control\nerror: [Errno 28] No space left on device\n",
     "error: [Errno 28] No space left on device"),
])
def test_pips_output_is_told_in_a_phrase(tmp_path, output, problem):
    log = tmp_path / "setup.log"
    log.write_text(output)
    assert package.pip_problem(str(log)) == problem

