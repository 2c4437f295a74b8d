"""The running kernel of an Ubuntu lab node, as its processes see it.

A container runs its host's kernel (here e.g. ``6.18.44-fc-v1272``), which is named neither as
Ubuntu names its kernels nor as one Canonical builds NVIDIA modules for. What gpunode reads of
the running kernel is its release (``uname -r`` and Python's ``os.uname()``, both libc's
``uname()``), so an Ubuntu lab node's processes get an Ubuntu kernel's release instead: a tiny
library preloaded into every process (``/etc/ld.so.preload``) answers ``uname()`` with the
kernel's own answer, its release replaced by the one in ``KERNEL_RELEASE_PATH`` (one line of
``[0-9A-Za-z.+_-]``; none, empty or anything else: the real release). Writing that file is how a
test "boots" the node into another kernel flavour (``6.8.0-64-custom``: one Canonical builds no
prebuilt modules for).

What is real: every process of the node, systemd included, sees that release. What is not:
no such kernel runs, ``/lib/modules/<release>`` holds nothing, and no module is ever loaded
(the GPU simulator stands for the loaded driver, as on every lab node).

The library is compiled on the lab host (``gcc``) once per source and kept in the lab's state
directory; it calls the kernel directly (``syscall``), so it runs under any glibc.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

# The release an Ubuntu lab node starts with: noble's GA kernel of the generic flavour, one the
# stand-in Ubuntu archive carries Canonical's prebuilt NVIDIA modules for
# (lab.standin.ubuntu.PREBUILT_KERNELS).
DEFAULT_UBUNTU_RELEASE = "6.8.0-64-generic"
KERNEL_RELEASE_PATH = "/var/lib/gpunode-lab/kernel-release"
LIBRARY_PATH = "/usr/local/lib/gpunode-lab/libgpunode-lab-uname.so"
PRELOAD_PATH = "/etc/ld.so.preload"


def source(release_path: str = KERNEL_RELEASE_PATH) -> str:
    """The library's C source, reading the release from ``release_path``."""
    if not release_path.startswith("/") or any(c in release_path for c in '"\\\n'):
        raise ValueError(f"not a plain absolute path: {release_path!r}")
    return _SOURCE_TEMPLATE.replace("@RELEASE_PATH@", release_path)


_SOURCE_TEMPLATE = """\
/* gpunode lab: uname() with the release of @RELEASE_PATH@ (lab.hwsim.kernel). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

static int allowed(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
        || c == '.' || c == '-' || c == '_' || c == '+';
}

int uname(struct utsname *buf) {
    long result = syscall(SYS_uname, buf);
    if (result != 0)
        return (int)result;
    long fd = syscall(SYS_openat, AT_FDCWD, "@RELEASE_PATH@", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char release[sizeof buf->release];
    long length = syscall(SYS_read, fd, release, sizeof release - 1);
    syscall(SYS_close, fd);
    /* Nothing, or more than a release holds: not a release. */
    if (length <= 0 || length == (long)sizeof release - 1)
        return 0;
    if (release[length - 1] == '\\n')
        length--;
    if (length <= 0)
        return 0;
    for (long i = 0; i < length; i++)
        if (!allowed(release[i]))
            return 0;
    for (long i = 0; i < length; i++)
        buf->release[i] = release[i];
    buf->release[length] = '\\0';
    return 0;
}
"""


class KernelLibraryError(RuntimeError):
    """The library could not be built; the message says what to do."""


def library(state_dir: Path, release_path: str = KERNEL_RELEASE_PATH) -> bytes:
    """The compiled library (built once per source, kept under ``state_dir``)."""
    text = source(release_path)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    built = state_dir / f"uname-{digest}.so"
    if not built.is_file():
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            raise KernelLibraryError(
                "an Ubuntu lab node's simulated kernel release needs a C compiler on the lab "
                "host: apt-get install gcc libc6-dev"
            )
        state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gpunode-uname-") as scratch:
            source_file = Path(scratch) / "uname.c"
            source_file.write_text(text)
            output = Path(scratch) / "uname.so"
            flags = ["-shared", "-fPIC", "-O2", "-fno-stack-protector"]
            result = subprocess.run(
                [compiler, *flags, "-o", str(output), str(source_file)],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise KernelLibraryError(f"compiling the uname library: {result.stderr[-2000:]}")
            shutil.move(output, built)
    return built.read_bytes()


def node_files(
    state_dir: Path, release: str = DEFAULT_UBUNTU_RELEASE
) -> dict[str, tuple[bytes, int]]:
    """Absolute node path -> (content, mode): the library, its preload entry, the release."""
    return {
        LIBRARY_PATH: (library(state_dir), 0o644),
        PRELOAD_PATH: (f"{LIBRARY_PATH}\n".encode(), 0o644),
        KERNEL_RELEASE_PATH: (f"{release}\n".encode(), 0o644),
    }
