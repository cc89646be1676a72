"""A Linux stand-in for lich's macOS confinement, with Landlock.

lich confines a session on macOS with sandbox-exec and a profile of its
own (docs/install.md, "In lich's macOS confined sessions"). Its rules, as
this project reads them:

- everything allowed, then no write anywhere, and no read below $HOME;
- read back below ~/.config, ~/.local/bin, ~/.local/share, ~/.local/state,
  ~/.gitconfig, ~/.pyenv, ~/.asdf and the folders of the claude and lich
  binaries (`read`);
- read and write back below the checkout, ~/.claude, ~/.claude.json,
  ~/.cache, ~/go/pkg, ~/.cargo/registry, ~/.npm, ~/.bun/install/cache and
  the git common dir (`write`);
- a path gets its rule only if it exists, and is no symbolic link, when the
  session starts; no rule for the network or signals; and no exception for
  /dev/null, $TMPDIR, /tmp or /var/tmp.

`confine` puts the same on this process and what it runs, for good:

    python tests/landlock.py --home H --checkout C [--read P]... [--write P]... -- argv...

Landlock (Linux 5.13 or later; reached through its three system calls
with ctypes) only ever allows, so the rules above are turned into an
allow-list with the same effect on files:

- read (and execute): each entry of every folder from / down to $HOME's
  parent, but the one on the way to $HOME, whole; then the read and the
  read-write paths below $HOME;
- write (every right Landlock has to create, remove, rename, truncate and
  open for writing): the read-write paths alone.

Where it differs from sandbox-exec, as a stand-in:

- Landlock does not govern a path's metadata: stat, access and readlink
  below $HOME still answer, where macOS refuses them (a program that
  looks for a file there is told it is there, and then cannot open it);
- the folders on the way to $HOME cannot be listed (a right on a folder is
  a right on all below it), where macOS lists them;
- an entry made after it starts in one of those folders (a new file in
  /tmp when $HOME is below /tmp) is not readable, where macOS reads it;
- ioctl on devices, Unix sockets' connect, the network and signals are left
  alone, as lich's profile leaves them; a descriptor opened before (the
  terminal) is used as it is, on both.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import platform
import sys
from typing import Iterable, List, Sequence

# x86_64's and aarch64's numbers (the generic table): the same on both.
SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
READ = EXECUTE | READ_FILE | READ_DIR
# What a rule on a file (not a folder) may grant.
FILE_RIGHTS = EXECUTE | READ_FILE | WRITE_FILE | TRUNCATE

# Below $HOME, relative to it.
READABLE = [".config", ".local/bin", ".local/share", ".local/state", ".gitconfig", ".pyenv", ".asdf"]
WRITABLE = [".claude", ".claude.json", ".cache", "go/pkg", ".cargo/registry", ".npm", ".bun/install/cache"]


class Unavailable(Exception):
    """This kernel (or machine) has no Landlock to confine with."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _calls():
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        raise Unavailable(f"no Landlock system call numbers known for {platform.machine()}")
    return ctypes.CDLL(None, use_errno=True), numbers


def abi() -> int:
    """Landlock's ABI version here; Unavailable when there is none."""
    libc, (create, _, _) = _calls()
    version = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if version < 0:
        raise Unavailable(f"Landlock is not available: {os.strerror(ctypes.get_errno())}")
    return version


def write_rights(version: int) -> int:
    rights = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO
              | MAKE_BLOCK | MAKE_SYM)
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    return rights


def existing(paths: Iterable[str]) -> List[str]:
    """The paths that exist and are no symbolic link, in order, once each: those lich gives a rule."""
    kept: List[str] = []
    for path in paths:
        path = os.path.abspath(path)
        if path not in kept and os.path.lexists(path) and not os.path.islink(path):
            kept.append(path)
    return kept


def outside(home: str) -> List[str]:
    """Everything but `home`'s tree, as whole entries: each entry of each
    folder from / to home's parent but the one leading to home."""
    home = os.path.realpath(home)
    found: List[str] = []
    folder = "/"
    for part in [p for p in home.split("/") if p]:
        for name in sorted(os.listdir(folder)):
            if name != part:
                found.append(os.path.join(folder, name))
        folder = os.path.join(folder, part)
    return found


def rules(home: str, checkout: str, read: Sequence[str] = (), write: Sequence[str] = ()):
    """(path, "read" or "write") for each rule, in the profile's order."""
    home = os.path.realpath(home)
    readable = existing([os.path.join(home, name) for name in READABLE] + list(read))
    writable = existing([checkout, *(os.path.join(home, name) for name in WRITABLE), *write])
    return ([(path, "read") for path in outside(home) if not os.path.islink(path)]
            + [(path, "read") for path in readable] + [(path, "write") for path in writable])


def confine(home: str, checkout: str, read: Sequence[str] = (), write: Sequence[str] = ()) -> None:
    """Puts this process, and all it runs, in the profile for good."""
    version = abi()
    libc, (create, add, restrict) = _calls()
    writing = write_rights(version)
    attr = _RulesetAttr(handled_access_fs=READ | writing)
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise Unavailable(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for path, kind in rules(home, checkout, read, write):
            rights = READ if kind == "read" else READ | writing
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since it was listed, or not ours to open: no rule
            try:
                if not os.path.isdir(path):
                    rights &= FILE_RIGHTS
                beneath = _PathBeneath(allowed_access=rights, parent_fd=fd)
                if libc.syscall(add, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(beneath),
                                ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="landlock.py", description="Run a program in the stand-in for lich's macOS profile.")
    parser.add_argument("--home", default=os.path.expanduser("~"), help="the home to deny (default: ~)")
    parser.add_argument("--checkout", default=os.getcwd(), help="the session's folder, read-write (default: here)")
    parser.add_argument("--read", action="append", default=[], help="a path read back (a binary's folder)")
    parser.add_argument("--write", action="append", default=[], help="a path read-write (the git common dir)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- and the program with its arguments")
    args = parser.parse_args(argv)
    program = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not program:
        parser.error("no program to run (give it after --)")
    try:
        confine(args.home, args.checkout, args.read, args.write)
    except (Unavailable, OSError) as exc:
        print(f"landlock.py: {exc}", file=sys.stderr)
        return 125
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        print(f"landlock.py: {program[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
