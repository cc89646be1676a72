"""lich's confined session on Linux, as bubblewrap arguments, and the
unprivileged user it runs as.

The profile is lich's (its internal/sandbox, bubblewrap on Linux), written
here from its description:

- the system read-only: /usr /etc /opt /nix bound as they are, /bin /sbin
  /lib* reproduced (a symlink as a symlink), /etc/ssh/ssh_config.d blanked,
  the target of /etc/resolv.conf when it points outside those;
- its own /proc and /dev, an empty private /tmp, an empty private $HOME
  and an empty private $XDG_RUNTIME_DIR;
- mounted back under the home, read-only: ~/.config, ~/.local/{bin,share,state},
  ~/.gitconfig and the toolchains (~/.pyenv, ~/.nvm, ...), and the folders
  holding the binary the session runs; read-write: ~/.claude, ~/.claude.json
  and the build caches (~/.cache, ...); last, the work folder, read-write;
- a pid, uts and ipc namespace of its own, the host name `lich-sandbox`,
  `--die-with-parent`, and the network shared.

A path that is not there, or is a symbolic link, is left out, as lich does.
"""
from __future__ import annotations

import os
import pwd
import shutil
from typing import List, Optional, Sequence

import attrs

BWRAP_ENV = "LICH_LIVE_BWRAP"  # bubblewrap's path (.ci/bwrap prints it)
USER_ENV = "LICH_LIVE_USER"  # the unprivileged user (.ci/test-user prints it)
HOSTNAME = "lich-sandbox"

SYSTEM_DIRS = ["/usr", "/etc", "/opt", "/nix"]
MERGED_DIRS = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
SSH_DROP_INS = "/etc/ssh/ssh_config.d"
# Claude Code's own state: its folder and the account file beside it.
CLAUDE_STATE = [".claude", ".claude.json"]
WRITABLE_CACHES = [".cache", "go/pkg", ".cargo/registry", ".npm", ".bun/install/cache"]
READABLE_TOOLCHAIN = [".config", ".local/bin", ".local/share", ".local/state", ".gitconfig", ".gitignore_global",
                      ".asdf", ".nvm", ".rustup", ".cargo/bin", ".bun/bin", ".deno", "go/bin", ".pyenv", ".rbenv",
                      ".sdkman"]


@attrs.frozen
class User:
    """The unprivileged user a confined session runs as."""

    name: str
    uid: int
    gid: int

    @classmethod
    def named(cls, name: str) -> "User":
        entry = pwd.getpwnam(name)
        return cls(name, entry.pw_uid, entry.pw_gid)

    def become(self) -> List[str]:
        """The argv prefix that runs a program as this user with the
        environment it is given (runuser and su reset HOME; setpriv does not)."""
        return [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--"]


def _existing(paths: Sequence[str]) -> List[str]:
    """Without duplicates, missing paths and symbolic links; in order."""
    kept: List[str] = []
    for path in paths:
        if path and path not in kept and os.path.lexists(path) and not os.path.islink(path):
            kept.append(path)
    return kept


def _system() -> List[str]:
    args: List[str] = []
    for folder in SYSTEM_DIRS:
        if os.path.exists(folder):
            args += ["--ro-bind", folder, folder]
    for folder in MERGED_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.exists(folder):
            args += ["--ro-bind", folder, folder]
    if os.path.exists(SSH_DROP_INS):
        args += ["--tmpfs", SSH_DROP_INS]
    resolv = os.path.realpath("/etc/resolv.conf")
    if (resolv != "/etc/resolv.conf" and os.path.exists(resolv)
            and not any(resolv == d or resolv.startswith(d + "/") for d in SYSTEM_DIRS)):
        args += ["--ro-bind", resolv, resolv]
    return args


def binary_dirs(path: str) -> List[str]:
    """The folders holding each hop of a binary's symlink chain, which lich
    mounts read-only (the binary itself is never bound)."""
    folders = []
    for _ in range(16):
        folders.append(os.path.dirname(path))
        if not os.path.islink(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return folders


def profile(home: str, work: str, runtime_dir: Optional[str], read: Sequence[str] = (),
            write: Sequence[str] = ()) -> List[str]:
    """bwrap's arguments, up to and without the `--` before the program:
    lich's profile for a session in `work` with the home `home`; `read` adds
    read-only folders (the binaries lich mounts), `write` read-write ones."""
    args = _system()
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", home]
    if runtime_dir and os.path.isabs(runtime_dir):
        args += ["--tmpfs", runtime_dir]
    for path in _existing([os.path.join(home, name) for name in READABLE_TOOLCHAIN] + list(read)):
        args += ["--ro-bind", path, path]
    for path in _existing([os.path.join(home, name) for name in CLAUDE_STATE + WRITABLE_CACHES] + list(write)):
        args += ["--bind", path, path]
    args += ["--bind", work, work]
    return args + ["--setenv", "HOME", home, "--chdir", work,
                   "--unshare-pid", "--unshare-uts", "--unshare-ipc", "--hostname", HOSTNAME,
                   "--die-with-parent"]
