"""The sandbox of the built-in `python` tool: model-written code runs in a separate `python -I`
process in its own temporary directory with a cleared environment, CPU-time, memory and file-size
limits, a wall-clock timeout that kills its process group, and an audit hook (it cannot be removed
from inside Python) that refuses sockets, subprocesses, ctypes and writes outside that directory.
Where the kernel allows it the child also enters new user and network namespaces (no network at all).

This stops the accidents model code makes (an endless loop, a huge list, a stray write, a download);
it is not a security boundary against code written to escape — run untrusted-by-design tools in a VM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

__all__ = ["SandboxLimits", "SandboxResult", "network_namespace_available", "run_python"]


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 5  # RLIMIT_CPU: CPU seconds before SIGXCPU
    memory_mb: int = 1024  # RLIMIT_AS: address space; a bigger allocation raises MemoryError
    file_mb: int = 16  # RLIMIT_FSIZE: the largest file the code (or its output) may write
    output_chars: int = 20_000  # of stdout+stderr kept; the tool response is cut again to its own limit


@dataclass(frozen=True)
class SandboxResult:
    output: str  # stdout and stderr, interleaved; ends with the exception's last line on an error
    status: str  # "ok" | "error" | "timeout" | "cpu_limit" | "output_limit" | "killed"
    returncode: int | None


# Entered first in the child: new user + network namespaces leave only a down loopback device.
_UNSHARE = r"""
try:
    import ctypes
    _libc = ctypes.CDLL(None, use_errno=True)
    NETNS = _libc.unshare(0x10000000 | 0x40000000) == 0  # CLONE_NEWUSER | CLONE_NEWNET
    del ctypes, _libc
except Exception:
    NETNS = False
"""

# Runs in the child before the model's code: limits, namespaces, then the audit hook, in that order
# (unshare needs ctypes, which the hook then refuses). argv: code file, cpu_s, memory bytes, file bytes.
_BOOTSTRAP = (
    r"""
import os, resource, sys
code_path, cpu, mem, fsize = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
"""
    + _UNSHARE
    + r"""
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
REFUSED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "pty.", "ctypes.", "os.kill", "os.killpg", "os.symlink", "os.link", "os.chroot",
           "gc.get_referrers", "gc.get_objects", "gc.get_referents", "sys.setprofile", "sys.settrace",
           "os.chdir", "os.setuid", "os.setgid", "resource.setrlimit", "resource.prlimit", "urllib.", "http.")
# event: (indices of path arguments, indices of dir_fd arguments) — a dir_fd makes a path unresolvable
PATH_EVENTS = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
               "os.rename": ((0, 1), (2, 3)), "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)),
               "os.utime": ((0,), (3,)), "os.truncate": ((0,), ()), "os.mkfifo": ((0,), (2,)),
               "os.mknod": ((0,), (3,)), "shutil.rmtree": ((0,), (1,))}


def _inside(path):
    if isinstance(path, int):
        return True  # an fd the process already holds
    real = os.path.realpath(os.fsdecode(path))
    return real == ROOT or real.startswith(ROOT + os.sep) or real == "/dev/null"


def _hook(event, args):
    if event.startswith(REFUSED):
        raise PermissionError(f"sandbox: {event} is not allowed (no network, processes or native code)")
    if event == "open":
        path, mode, flags = args
        writes = (mode is not None and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS
        if not _inside(path) and (writes or os.path.isdir(path)):  # a directory fd would allow dir_fd= writes
            what = "writing" if writes else "opening the directory"
            raise PermissionError(f"sandbox: {what} {path!r} is not allowed; use the working directory")
    elif event in PATH_EVENTS:
        paths, dir_fds = PATH_EVENTS[event]
        if any(i < len(args) and args[i] not in (None, -1) for i in dir_fds):
            raise PermissionError(f"sandbox: {event} with dir_fd is not allowed")
        for i in paths:
            if i < len(args) and not _inside(args[i]):
                raise PermissionError(f"sandbox: {event} on {args[i]!r} is not allowed outside the working directory")


with open(code_path, encoding="utf-8") as f:
    source = f.read()
os.remove(code_path)
sys.argv = ["main.py"]
sys.addaudithook(_hook)
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
del f, code_path, cpu, mem, fsize
try:
    exec(compile(source, "main.py", "exec"), namespace)
except SystemExit:
    raise
except BaseException as e:
    import traceback
    tb = e.__traceback__
    line = next((fs.lineno for fs in reversed(traceback.extract_tb(tb)) if fs.filename == "main.py"), None)
    last = traceback.format_exception_only(type(e), e)[-1].strip()
    where = f"line {line}: " if line else ""
    memory = " (the sandbox's memory limit)" if isinstance(e, MemoryError) else ""
    sys.stdout.flush()
    print(f"Error at {where}{last}{memory}", file=sys.stderr, flush=True)
    sys.exit(1)
"""
)

_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def run_python(code: str, timeout_s: float, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a script in a fresh sandboxed process and return what it printed; the process
    group is killed at `timeout_s` seconds of wall-clock time."""
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="megarl-sandbox-") as workdir, tempfile.TemporaryFile() as out:
        code_path = os.path.join(workdir, ".main.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        env = dict(_ENV, HOME=workdir, TMPDIR=workdir)
        argv = [
            sys.executable,
            "-I",
            "-B",
            "-u",
            "-X",
            "utf8",
            "-c",
            _BOOTSTRAP,
            code_path,
            str(limits.cpu_s),
        ]
        argv += [str(limits.memory_mb << 20), str(limits.file_mb << 20)]
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # also anything it left running in its group
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        out.seek(0)
        text = out.read(limits.output_chars * 4).decode("utf-8", errors="replace")[: limits.output_chars]
    return SandboxResult(output=text, status=_status(returncode), returncode=returncode)


def _status(returncode: int | None) -> str:
    if returncode is None:
        return "timeout"
    if returncode == 0:
        return "ok"
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
        # the kernel sends SIGKILL at the hard CPU limit when SIGXCPU was ignored
        return "cpu_limit" if returncode == -signal.SIGXCPU else "killed"
    if returncode == -signal.SIGXFSZ:
        return "output_limit"
    return "error"


def network_namespace_available() -> bool:
    """Whether this machine lets an unprivileged process enter new user and network namespaces
    (the sandbox then has no network even below the audit hook)."""
    argv = [sys.executable, "-I", "-c", _UNSHARE + "print(NETNS)\n"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=_ENV)
    return result.stdout.strip() == "True"
