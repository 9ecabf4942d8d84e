"""An LD_PRELOAD shim that counts every fsync/fdatasync and can make each one slower.

    from fsync_shim import build_shim, shim_env, sync_count

`build_shim(dir)` compiles a tiny C library (with the system `cc`) that wraps
`fsync` and `fdatasync`: each call is counted, and when the environment
variable `LGFS_FSYNC_DELAY_US` is set, it sleeps that many microseconds after
the real call returns, so that a fast disk behaves like a real SSD or a cloud
volume (0.5-10 ms per sync). A process started with `shim_env(...)` loads it;
inside that process `sync_count()` reads the counter. SQLite links `fsync` /
`fdatasync` from libc dynamically, so every sync SQLite makes goes through it.

Linux only (LD_PRELOAD, `cc`); `available()` says whether it can be built.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = ["add_option", "available", "build_shim", "rerun_slower", "shim_env", "sync_count"]

_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long lgfs_syncs = 0;
static long lgfs_delay_us = -1;

long long lgfs_shim_syncs(void) { return __atomic_load_n(&lgfs_syncs, __ATOMIC_SEQ_CST); }

static void lgfs_after_sync(void) {
    __atomic_add_fetch(&lgfs_syncs, 1, __ATOMIC_SEQ_CST);
    if (lgfs_delay_us < 0) {
        const char *v = getenv("LGFS_FSYNC_DELAY_US");
        lgfs_delay_us = v ? atol(v) : 0;
    }
    if (lgfs_delay_us > 0) {
        struct timespec ts = {lgfs_delay_us / 1000000, (lgfs_delay_us % 1000000) * 1000};
        while (nanosleep(&ts, &ts) != 0) {}
    }
}

int fsync(int fd) {
    static int (*real)(int) = 0;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int rc = real(fd);
    lgfs_after_sync();
    return rc;
}

int fdatasync(int fd) {
    static int (*real)(int) = 0;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int rc = real(fd);
    lgfs_after_sync();
    return rc;
}
"""


def available() -> bool:
    """Whether the shim can be built and loaded here (Linux with a C compiler)."""
    return os.uname().sysname == "Linux" and shutil.which("cc") is not None


def build_shim(directory: str) -> str:
    """Compile the shim into `directory` and return the library's path."""
    src = os.path.join(directory, "lgfs_fsync_shim.c")
    lib = os.path.join(directory, "lgfs_fsync_shim.so")
    with open(src, "w") as f:
        f.write(_SOURCE)
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", lib, src, "-ldl"],
        check=True,
        capture_output=True,
    )
    return lib


def shim_env(lib: str, delay_ms: float = 0.0) -> dict[str, str]:
    """Return an environment that preloads `lib` with each sync `delay_ms` slower."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib
    env["LGFS_FSYNC_DELAY_US"] = str(int(delay_ms * 1000))
    return env


def sync_count() -> int | None:
    """Return how many fsync/fdatasync calls this process made, or None without the shim."""
    try:
        fn = ctypes.CDLL(None).lgfs_shim_syncs
    except AttributeError:
        return None
    fn.restype = ctypes.c_longlong
    return int(fn())


def add_option(parser: Any) -> None:
    """Add `--fsync-ms` (every fsync that many ms slower) to a benchmark's parser."""
    parser.add_argument(
        "--fsync-ms",
        type=float,
        default=None,
        help="SQLite only, every fsync this many ms slower (an LD_PRELOAD shim)",
    )


def rerun_slower(script: str, argv: Sequence[str], slower: float | None) -> int | None:
    """Run `script` again under the shim when `--fsync-ms` asks for it; return its exit code.

    LD_PRELOAD is read when a process starts, so a script asked for slower
    fsyncs re-runs itself in a child that loads the shim. Returns None when
    nothing was asked (or this already is that child): the caller goes on.
    """
    if slower is None or "LGFS_FSYNC_DELAY_US" in os.environ:
        return None
    if not available():
        print("result: skipped (--fsync-ms needs Linux and a C compiler)")
        return 0
    with tempfile.TemporaryDirectory() as shim_dir:
        lib = build_shim(shim_dir)
        child = [sys.executable, os.path.abspath(script), *argv]
        return subprocess.run(child, env=shim_env(lib, slower)).returncode
