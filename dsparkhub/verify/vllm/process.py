"""The child process that runs vLLM (``python -m dsparkhub.verify.vllm.child``) and its JSON-file protocol.

vLLM is imported only by the child, so vLLM's global state, spawned processes and crashes never reach the caller;
a crash, an out-of-memory kill or a hang is reported as a :class:`~dsparkhub.errors.VerifyError` with the child's
exit status and the tail of its log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsparkhub.errors import VerifyError


LOG_TAIL_CHARS = 4000
# Written by the child into its log right before the traceback of an exception it answers with.
CHILD_EXCEPTION_MARKER = "=== dsparkhub vllm_child: exception follows ==="
DEFAULT_TIMEOUT_S = 1800.0


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


class ChildProcess:
    """A ``python -m dsparkhub.verify.vllm.child`` process and its JSON-file protocol.

    The parent writes a request file and its path on the child's stdin; the child writes ``<request>.out.json``
    (atomically: temp file, then rename) and waits for the next line. EOF on stdin ends it. The child's stdout and
    stderr (vLLM's logs) go to ``child.log`` in the work folder, whose tail ends up in error messages.

    Args:
        mode: ``"engine"`` (one vLLM ``LLM``; first request starts it) or ``"check"`` (``check_with_vllm``).
        env: extra environment variables for the child.
        python: the interpreter (default: this one).
    """

    def __init__(self, mode: str, *, env: dict[str, str] | None = None, python: str | None = None,
                 workdir: str | Path | None = None):
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="dsparkhub-vllm-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "child.log"
        self._counter = 0
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        # The child's temp files (vLLM's, the gloo rendezvous file) live in the work folder close() deletes.
        child_env["TMPDIR"] = str(self.workdir)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", "dsparkhub.verify.vllm.child", mode],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, env=child_env,
            cwd=str(self.workdir), start_new_session=True,  # its own process group: vLLM's workers die with it
        )

    def request(self, payload: dict, *, timeout_s: float, what: str) -> dict:
        """Send one request and wait for its response.

        Returns:
            The response dict (may hold ``"error"``: the child caught an exception and is still usable or exited).

        Raises:
            VerifyError: the child exited without answering (crash, OOM kill: exit status and log tail in the
                message) or did not answer within ``timeout_s`` (the child is killed).
        """
        self._counter += 1
        req = self.workdir / f"request-{self._counter}.json"
        out = self.workdir / f"request-{self._counter}.out.json"
        req.write_text(json.dumps(payload))
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((str(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the child is gone; reported below with its exit status
        deadline = time.monotonic() + timeout_s
        while True:
            if out.exists():
                return json.loads(out.read_text())
            code = self.proc.poll()
            if code is not None:
                if out.exists():
                    return json.loads(out.read_text())
                raise VerifyError(self._died_message(code, what), path=self.keep_log(),
                                  hint="Read the full log at the path above; rerun with fewer/shorter prompts or "
                                       "a smaller max_model_len if it was killed for memory.")
            if time.monotonic() > deadline:
                self.kill()
                raise VerifyError(
                    f"{what} did not answer within {timeout_s:.0f} s; the child process was killed. "
                    f"Last lines of its log:\n{_tail(self.log_path)}",
                    path=self.keep_log(), hint="Raise timeout_s or lower the number of prompts.")
            time.sleep(0.05)

    def keep_log(self) -> Path:
        """Copy the child's log next to its work folder (which :meth:`close` deletes); return the copy's path."""
        kept = self.workdir.parent / f"{self.workdir.name}.log"
        try:
            shutil.copyfile(self.log_path, kept)
        except OSError:
            return self.log_path
        return kept

    def _died_message(self, code: int, what: str) -> str:
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            status = f"was killed by {name}" + (" (often the out-of-memory killer)" if -code == 9 else "")
        else:
            status = f"exited with status {code}"
        return f"{what}: the vLLM child process {status} before answering. Last lines of its log:\n" \
               f"{_tail(self.log_path)}"

    def kill(self) -> None:
        """Kill the child and its process group (vLLM's engine-core workers)."""
        # The group outlives its leader when vLLM's engine-core processes are still running: kill it either way.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc.wait()

    def close(self, *, grace_s: float = 30.0) -> None:
        """Ask the child to exit (EOF on stdin), kill it after ``grace_s``, and delete its work folder."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # also reaps workers left in the group after a clean exit
        self._log.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


# Log-line prefixes vLLM and torch add in child processes: "(EngineCore pid=12) ",
# "ERROR 12-01 22:37:21 [core.py:1510] ", "[rank0]: " (vllm/logger.py format, vllm/utils/system_utils.py
