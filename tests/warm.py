"""Warm starts: litlab's console scripts as real, separate processes, forked from a server that has
already imported the heavy third-party libraries (torch, Lightning, Hydra) instead of importing them
again. A cold ``import lightning`` is ~5 s of CPU on 2 cores, most of a tiny run; the suite starts
about a hundred such processes.

A warm child is a process of its own, as a cold one is: its own pid (and session when asked), the
environment, arguments, working directory and stdin/stdout/stderr of the request; it runs the console
script from its first line, so litlab and your project are imported in it, after its environment is
set; the processes it starts start as below (Sweep jobs and ranks). What it does not repeat is the
interpreter's start and those libraries' imports. So:

- the server is started with the request's import-time environment (``IMPORT_TIME`` variables:
  the interpreter's, torch's threading and CUDA ones, the locale); a request that differs gets a
  server of its own;
- a test of what happens while a process starts (which modules a failing command imported, what
  Lightning's import does to the environment, warnings printed while importing) starts cold:
  ``litlab(..., cold=True)``, as the README commands, ``make`` targets and the bench always do.

Sweep jobs and ranks: the device pool starts each job as ``python -m litlab.cli.train ...``,
Lightning each rank but rank 0 as the command with LOCAL_RANK set. In the commands the tests start
warm, tests/warm_jobs/sitecustomize.py has such a process hand its command to a server of its own
import-time environment (``run_job_warm``) and stand for the warm child until it ends: it passes on
the signals it gets (the pool's SIGTERM to the job's process group), and exits as the child did; the
child takes its CPU cores and its command line, and ends when its stand-in does. The first process
of an environment starts that server and waits for it. torchrun's workers start warm the same way;
tasks of Slurm or submitit, and everything the bench starts, run cold.

Server protocol, over a Unix socket, one connection per child: the request (JSON: argv, env, cwd,
new_session, affinity) with its stdin, stdout and stderr (and a job's stand-in pipe) passed as file
descriptors; the server answers the child's pid, then its wait status when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

# What every litlab-train imports before it trains; litlab and the project are never preloaded.
PRELOAD = (
    "torch",
    "lightning",
    "lightning.pytorch",
    "torchmetrics",
    "torchvision",
    "hydra",
    "hydra._internal.utils",
    "omegaconf",
    "fsspec",
    "psutil",
    "torch.utils.tensorboard",
)
# Environment variables read when the interpreter starts or while the preloaded libraries import.
IMPORT_TIME = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA", "NVIDIA", "LD_")
IMPORT_TIME += ("LANG", "LC_", "TZ")
SERVER_START_S = 120
JOB_SERVER_IDLE_S = 300  # a sweep jobs' server with no child for this long ends (its memory back)


def import_time_environment(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    # torchrun's TORCHELASTIC_* (run id, restart count, a file per worker) are read as it trains.
    return tuple(
        sorted(
            (k, v) for k, v in env.items() if k.startswith(IMPORT_TIME) and not k.startswith("TORCHELASTIC_")
        )
    )


# --- the client: used by the tests ----------------------------------------------------------------


class WarmProcess:
    """The subset of ``subprocess.Popen`` the tests use, for a child of a warm server."""

    def __init__(self, connection: socket.socket, pid: int, args: list[str]) -> None:
        self.args, self.pid, self.returncode = args, pid, None
        self._connection = connection
        self._answer = b""
        self.stdout: IO[str] | None = None
        self.stderr: IO[str] | None = None

    def poll(self) -> int | None:
        return self._read_status(timeout=0.0)

    def wait(self, timeout: float | None = None) -> int:
        if self._read_status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _read_status(self, timeout: float | None) -> int | None:
        """The exit status once the server sends it, waiting up to ``timeout`` (None: for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._connection.settimeout(left)
            try:
                chunk = self._connection.recv(64)
            except (TimeoutError, BlockingIOError):
                return None
            if not chunk:
                raise RuntimeError(f"the warm-start server ended before its child {self.pid} did")
            self._answer += chunk
            if self._answer.endswith(b"\n"):
                self.returncode = os.waitstatus_to_exitcode(int(self._answer))
                self._connection.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Read stdout and stderr to their ends, then wait, as ``Popen.communicate`` does."""
        outputs: dict[str, str] = {}
        readers = [
            threading.Thread(target=lambda n=name, s=stream: outputs.__setitem__(n, s.read()), daemon=True)
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
            if stream is not None
        ]
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.1, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return outputs.get("stdout"), outputs.get("stderr")


class WarmStarts:
    """The servers of this test process, one per import-time environment, started when first needed."""

    def __init__(self) -> None:
        self._servers: dict[tuple[tuple[str, str], ...], tuple[subprocess.Popen, str]] = {}
        self._folder = tempfile.mkdtemp(prefix="litlab-warm-")
        self._lock = threading.Lock()
        atexit.register(self.close)

    def popen(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path | str,
        *,
        stdout: int | None = None,
        stderr: int | None = None,
        start_new_session: bool = False,
    ) -> WarmProcess:
        """Start ``argv`` (a console script and its arguments) as a warm child. ``stdout``/``stderr``:
        ``subprocess.PIPE`` (text, read from ``.stdout``/``.stderr``), ``subprocess.STDOUT`` (stderr
        into stdout) or None (this process's)."""
        path = self._server(import_time_environment(env))
        pipes: dict[str, tuple[int, int]] = {}
        for name, wanted in (("stdout", stdout), ("stderr", stderr)):
            if wanted == subprocess.PIPE:
                pipes[name] = os.pipe()
        child_stdout = pipes["stdout"][1] if "stdout" in pipes else 1
        if stderr == subprocess.STDOUT:
            child_stderr = child_stdout
        else:
            child_stderr = pipes["stderr"][1] if "stderr" in pipes else 2
        request = {"argv": argv, "env": env, "cwd": str(cwd), "new_session": start_new_session}
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(path)
        socket.send_fds(connection, [json.dumps(request).encode()], [0, child_stdout, child_stderr])
        for _, write_end in pipes.values():
            os.close(write_end)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = connection.recv(64)
            if not chunk:
                raise RuntimeError(f"the warm-start server at {path} refused {argv}")
            answer += chunk
        process = WarmProcess(connection, int(answer), argv)
        for name, (read_end, _) in pipes.items():
            setattr(process, name, open(read_end, encoding="utf-8", errors="replace"))  # noqa: SIM115
        return process

    def run(
        self, argv: list[str], env: dict[str, str], cwd: Path | str, timeout: float
    ) -> subprocess.CompletedProcess:
        """``subprocess.run(argv, capture_output=True, text=True, ...)`` as a warm child."""
        process = self.popen(argv, env, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        return subprocess.CompletedProcess(argv, process.returncode, out, err)

    def job_servers(self) -> str:
        """LITLAB_TEST_WARM_JOBS: where sweep jobs find (or start) their servers, and the process
        whose end ends those servers (this one)."""
        return f"{self._folder}:{os.getpid()}"

    def job_children(self, grace_s: float = 2.0) -> list[Any]:
        """The warm children of this process's job servers still alive after ``grace_s``: sweep jobs
        and ranks that outlived their stand-ins (which a check for leftover processes of a run's
        process group cannot see: a warm child is in its server's session). psutil processes."""
        import psutil

        deadline = time.monotonic() + grace_s
        prefix = os.path.join(self._folder, "jobs-")
        while True:
            processes = {p.pid: p for p in psutil.process_iter(["pid", "ppid", "status", "cmdline"])}
            servers = {
                pid
                for pid, p in processes.items()
                if any(a.startswith(prefix) for a in p.info["cmdline"] or ())
            }
            alive = []  # their children, and everything those started (DataLoader workers...)
            for pid, process in processes.items():
                parent = process.info["ppid"]
                while parent in processes and parent not in servers:
                    parent = processes[parent].info["ppid"]
                if (
                    parent in servers
                    and pid not in servers
                    and process.info["status"] != psutil.STATUS_ZOMBIE
                ):
                    alive.append(process)
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)

    def _server(self, key: tuple[tuple[str, str], ...]) -> str:
        with self._lock:
            if key in self._servers:
                server, path = self._servers[key]
                if server.poll() is None:
                    return path
            path = os.path.join(self._folder, f"server-{len(self._servers)}.sock")
            env = {k: v for k, v in os.environ.items() if not k.startswith(IMPORT_TIME)}
            server = subprocess.Popen(
                [sys.executable, __file__, path],
                env={**env, **dict(key)},
                stdin=subprocess.PIPE,  # the server ends when this process closes it (or ends)
                stdout=subprocess.PIPE,
                text=True,
            )
            ready = server.stdout.readline() if server.stdout else ""
            if ready.strip() != "ready":
                server.kill()
                raise RuntimeError(f"the warm-start server did not start: {ready!r} (exit {server.poll()})")
            self._servers[key] = (server, path)
            return path

    def close(self) -> None:
        for server, _ in self._servers.values():
            if server.stdin:
                with contextlib.suppress(OSError):
                    server.stdin.close()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        self._servers.clear()


# --- the server: ``python tests/warm.py SOCKET`` --------------------------------------------------


def serve(path: str, owner: int | None = None) -> None:
    """Serve warm children at ``path`` until stdin closes, or (a sweep jobs' server) until the test
    process ``owner`` ends or it has been idle for JOB_SERVER_IDLE_S."""
    if owner is not None:  # started by a job pinned to its cores: children take their own
        os.sched_setaffinity(0, os.sched_getaffinity(owner))
    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".binding")
    listener.listen(16)
    os.rename(path + ".binding", path)  # clients see the socket once it listens
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of it
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    if owner is None:
        selector.register(sys.stdin, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    print("ready", flush=True)
    sys.stderr.flush()
    last_busy = time.monotonic()
    while True:
        if waiting:
            last_busy = time.monotonic()
        if owner is not None and (not _alive(owner) or time.monotonic() - last_busy > JOB_SERVER_IDLE_S):
            for name in (path, path + ".starting"):  # the next job starts a new server
                with contextlib.suppress(OSError):
                    os.unlink(name)
            return
        for key, _ in selector.select(timeout=None if owner is None else 1.0):
            if key.fileobj is sys.stdin:  # the test process closed it, or ended
                return
            if key.fileobj == wake_read:
                os.read(wake_read, 4096)
                _reap(waiting)
                continue
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 4)
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                for fd in (wake_read, wake_write):
                    os.close(fd)
                for other in waiting.values():
                    other.close()
                _become(json.loads(message), fds, connection)  # raises SystemExit, never returns
            for fd in fds:
                os.close(fd)
            connection.sendall(f"{pid}\n".encode())
            waiting[pid] = connection
        _reap(waiting)


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(f"{status}\n".encode())
            connection.close()


def _become(request: dict[str, Any], fds: list[int], connection: socket.socket) -> None:
    """The child: take the request's place and run its console script as ``__main__``."""
    import runpy

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    connection.close()
    if request["new_session"]:
        os.setsid()
    stand_in = fds[3] if len(fds) > 3 else None
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds[:3]):
        if fd > 2 and fd != stand_in:
            os.close(fd)
    if request.get("affinity"):
        os.sched_setaffinity(0, request["affinity"])
    if stand_in is not None:  # a job's or a rank's: it ends (with its ranks) when its stand-in does
        threading.Thread(
            target=_end_with_stand_in, args=(stand_in,), name="warm-job-stand-in", daemon=True
        ).start()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _reseed_numpy()
    _read_rank_again()
    if stand_in is not None:
        import setproctitle  # a dev dependency (pyproject.toml)

        # Its command line, as ps and pgrep show a cold one's.
        setproctitle.setproctitle(" ".join([sys.executable, *request["argv"]]))
    if request["argv"][0] == "-m":  # python -m MODULE ARGS (a sweep job, or a rank of one)
        sys.argv = ["-m", *request["argv"][2:]]
        sys.path[0] = request["cwd"]  # as a cold `python -m` has it
        runpy.run_module(request["argv"][1], run_name="__main__", alter_sys=True)
        sys.exit(0)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as a cold `python SCRIPT` has it
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def _end_with_stand_in(fd: int) -> None:
    while os.read(fd, 64):
        pass
    os.killpg(os.getpid(), signal.SIGKILL)  # the stand-in was killed: so is the job, as one process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- a sweep job's stand-in: tests/warm_jobs/sitecustomize.py -----------------------------------

# Set by a cluster or a launcher other than Lightning's (Slurm, submitit, LSF, MPI): their tasks'
# processes start cold, as they are. torchrun's workers are its own children on this machine, as a
# sweep's jobs are the pool's: every one of them starts warm.
_CLUSTER_PREFIXES = ("SLURM_", "SUBMITIT_", "LSB_", "JSM_", "PMI_", "OMPI_")
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "GROUP_RANK")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def hands_over(env: dict[str, str]) -> bool:
    """Whether a litlab command's process with this environment runs as a warm child: a rank other
    than 0 that Lightning started (LOCAL_RANK), any worker torchrun started, or a sweep job's process."""
    if any(k.startswith(_CLUSTER_PREFIXES) for k in env):
        return False
    if "TORCHELASTIC_RUN_ID" in env:  # a worker torchrun started, rank 0 included
        return True
    if "LOCAL_RANK" in env:
        return env["LOCAL_RANK"] != "0"
    return "LITLAB_SWEEP_JOB" in env and not any(k in env for k in _RANK_VARIABLES)


def run_job_warm(setting: str, argv: list[str]) -> None:
    """In the process of a litlab command, before it imports anything: if it is a sweep job's or a
    Lightning rank's (``hands_over``), run the command as a warm child and exit as it did. Returns
    (the command runs cold) otherwise, and when the server of this environment cannot start.
    ``setting``: ``FOLDER:OWNER_PID`` (LITLAB_TEST_WARM_JOBS, from tests/conftest.py); ``argv``: the
    command after the interpreter, without its ``-u`` (the child writes unbuffered as the server
    does, PYTHONUNBUFFERED)."""
    env = dict(os.environ)
    if not hands_over(env):
        return
    folder, owner = setting.rsplit(":", 1)
    name = hashlib.sha256(repr(import_time_environment(env)).encode()).hexdigest()[:16]
    path = os.path.join(folder, f"jobs-{name}.sock")
    connection = _job_server(path, int(owner))
    if connection is None:
        return
    stand_in_read, stand_in_write = os.pipe()
    request = {
        "argv": argv,
        "env": env,
        "cwd": os.getcwd(),
        "new_session": True,  # the child's group: itself and its ranks, as the pool's job has
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2, stand_in_read])
    os.close(stand_in_read)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = connection.recv(64)
        if not chunk:  # the server ended (idle) before it forked: the job runs cold
            connection.close()
            os.close(stand_in_write)
            return
        answer += chunk
    child = int(answer)

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = connection.recv(64)
        if not chunk:  # never the job run twice: it ends here (its child with it)
            print(f"tests/warm.py: the job server ended before its child {child} did", file=sys.stderr)
            os._exit(1)
        answer += chunk
    code = os.waitstatus_to_exitcode(int(answer))
    if code < 0:  # killed by a signal: so is the stand-in
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, nor needs to be
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)  # a signal whose default is not to end a process
    os._exit(code & 0xFF)


def _job_server(path: str, owner: int) -> socket.socket | None:
    """A connection to the server of this environment, which the first job that needs it starts (the
    others wait, at most as long as a server takes to start); None if it cannot start."""
    server: subprocess.Popen | None = None
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            return connection
        except OSError:
            connection.close()
        if os.path.exists(path + ".failed"):
            return None
        if server is None and not os.path.exists(path + ".starting"):
            try:
                os.close(os.open(path + ".starting", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            with open(path + ".log", "w") as log:
                server = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), path, str(owner)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,
                )
        elif server is not None and server.poll() is not None:
            Path(path + ".failed").touch()  # its log says why; every job of it runs cold
            return None
        time.sleep(0.1)
    return None


def _read_rank_again() -> None:
    """Lightning reads the process's rank from the environment once, as it is imported: in the server,
    whose environment is that of the job that started it (a DDP rank 1 made every later child rank 1).
    Read again here, from the child's, as a cold import reads it."""
    from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only

    rank_zero_only.rank = _get_rank() or 0


def _reseed_numpy() -> None:
    """numpy seeds its global generator from the OS at import, once: in the server. Python's
    ``random`` reseeds itself in a forked child; numpy does not."""
    import numpy as np

    np.random.seed(int.from_bytes(os.urandom(4), "little"))


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
    sys.exit(0)
