"""The SPS table from SGLang's own profiler, ``sglang.benchmark.dspark_sps_profiler`` (SGLang 0.5.23), run against an
already-running DSpark server.

The profiler (``benchmark/dspark_sps_profiler.py``, ``cli_main``) never starts a server: ``all --base-url URL --out
PATH`` holds the server at each per-rank request count of ``--batch-size`` (a tapered sweep up to
``--max-batch-size`` otherwise), reads the aligned steady steps and fits ``SpsCostTable`` (``_fit_sps_table``: one
median steps/s per batch-token count), self-checks it with SGLang's reader and writes PATH plus
``<stem>.records.jsonl`` / ``<stem>.rounds.jsonl`` / ``PATH.manifest.json`` beside it. dsparkhub runs it in a
temporary folder with the SGLang environment's interpreter (:func:`dsparkhub.verify.sglang.checks.
find_sglang_python`) and hands the table back with a label of where it came from;
:func:`dsparkhub.verify.sps_table.engine_table` checks it with the rules of SGLang's reader and labels it.

Not here: serving (the user's server) or the reference engine's own table (``dsparkhub.verify.costs``).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from dsparkhub.errors import EngineUnavailableError, VerifyError
from dsparkhub.verify.costs import run_profiler

__all__ = ["profiler_command", "profile_sps"]

MODULE = "sglang.benchmark.dspark_sps_profiler"
TIMEOUT_S = 7200


def profiler_command(python: str | Path, *, base_url: str, out: str | Path, batch_sizes: list[int] | None = None,
                     repeats: int = 1) -> list[str]:
    """``python -m sglang.benchmark.dspark_sps_profiler all ...`` (SGLang 0.5.23 flags; no plot: plotly and
    kaleido are optional there)."""
    cmd = [str(python), "-m", MODULE, "all", "--base-url", base_url.rstrip("/"), "--out", str(out), "--no-plot",
           "--repeats", str(repeats)]
    if batch_sizes:
        cmd += ["--batch-size", *map(str, sorted(set(batch_sizes)))]
    return cmd


def profile_sps(*, base_url: str, batch_sizes: list[int] | None = None, repeats: int = 1,
                python: str | Path | None = None, timeout_s: float = TIMEOUT_S,
                run=subprocess.run) -> tuple[dict, str]:
    """Run SGLang's profiler against the DSpark server at ``base_url`` and return its table.

    Args:
        base_url: the running DSpark server (``http://host:port``).
        batch_sizes: per-rank request counts to hold (default: SGLang's tapered sweep up to 256).
        python: the SGLang environment's interpreter (default ``find_sglang_python()``).
        run: ``subprocess.run`` (tests pass a stand-in).

    Returns:
        ``(table, source)``: the JSON the profiler wrote, unchanged, and where it came from in words.

    Raises:
        EngineUnavailableError: no SGLang environment, or the profiler exits non-zero (its last lines quoted).
        VerifyError: the profiler wrote no readable table.
    """
    from dsparkhub.verify.sglang.checks import find_sglang_python

    exe = python or find_sglang_python()
    if exe is None:
        raise EngineUnavailableError("SGLang's dspark_sps_profiler needs an SGLang environment, and none was found",
                                     hint="build it with `bash scripts/setup_sglang.sh`, or set "
                                          "DSPARKHUB_SGLANG_PYTHON to its python")
    with tempfile.TemporaryDirectory(prefix="dsparkhub-sps-") as tmp:
        out = Path(tmp) / "dspark_sps.json"
        cmd = profiler_command(exe, base_url=base_url, out=out, batch_sizes=batch_sizes, repeats=repeats)
        run_profiler(run, cmd, what="SGLang's dspark_sps_profiler", timeout_s=timeout_s,
                     timeout_hint="profile fewer batch sizes",
                     failure_hint=f"is a DSpark server running at {base_url}? (the profiler never starts one)")
        try:
            data = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise VerifyError(f"SGLang's dspark_sps_profiler wrote no readable table: {exc}") from None
        manifest = out.with_name(out.name + ".manifest.json")  # the server's layout, when it wrote one
        try:
            info = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            info = {}
        layout = ", ".join(f"{k} {info[k]}" for k in ("tp_size", "dp_size", "verify_num_draft_tokens")
                           if isinstance(info, dict) and info.get(k) is not None)
    sizes = "SGLang's tapered sweep" if not batch_sizes else f"batch sizes {sorted(set(batch_sizes))}"
    return data, (f"sglang.benchmark.dspark_sps_profiler against {base_url.rstrip('/')} ({sizes}, {repeats} "
                  f"repeat(s){', ' + layout if layout else ''}): steady steps of the running server")
