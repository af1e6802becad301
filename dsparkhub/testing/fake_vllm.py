"""A stand-in for the ``vllm`` command (``serve`` and ``bench serve``), stdlib only, for tests of the load sweep.

Tests write it out as an executable script (:func:`install`) and point ``DSPARKHUB_VLLM`` at it. ``serve`` answers
``/health``, ``/v1/models``, ``/metrics`` (``vllm:spec_decode_*`` counters, ``vllm:num_requests_running``) and
``/v1/completions`` (``return_token_ids``; the output is a function of the prompt alone, so the drafter server is
"lossless"); ``bench serve`` reads a ``custom`` JSONL file, sends it at ``--max-concurrency`` and writes a result
JSON in vLLM 0.32's keys. Misbehaviour on request, through the environment:

* ``FAKE_VLLM_DIE_AFTER=K``: a server *with* a drafter exits after answering K completions;
* ``FAKE_VLLM_MAX_RUNNING=M``: the server runs at most M requests at once (the rest queue);
* ``FAKE_VLLM_LOSSY=1``: the drafter server changes one output token;
* ``FAKE_VLLM_DELAY=S``: seconds each request takes (default 0.1).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SOURCE = Path(__file__)


def install(folder: Path) -> Path:
    """Write the fake as ``folder/vllm`` with this interpreter in its shebang; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "vllm"
    exe.write_text(f"#!{sys.executable}\n" + SOURCE.read_text())
    exe.chmod(0o755)
    return exe


def _arg(argv: list[str], name: str, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


def _ids(prompt) -> list[int]:
    return [int(t) for t in prompt] if isinstance(prompt, list) else [ord(c) % 97 for c in str(prompt)]


def serve(argv: list[str]) -> None:
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    model, port = argv[0], int(_arg(argv, "--port"))
    spec = json.loads(_arg(argv, "--speculative-config", "null") or "null")
    n = int(spec["num_speculative_tokens"]) if spec else 0
    die_after = int(os.environ.get("FAKE_VLLM_DIE_AFTER", "0")) if spec else 0
    gate = threading.BoundedSemaphore(int(os.environ.get("FAKE_VLLM_MAX_RUNNING", "1000")))
    lock = threading.Lock()
    state = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * n, "running": 0, "served": 0}

    def metrics() -> str:
        label = f'model_name="{model}"'
        lines = [f"vllm:num_requests_running{{{label}}} {state['running']}.0"]
        if spec:
            lines += [f"vllm:spec_decode_num_drafts_total{{{label}}} {state['drafts']}.0",
                      f"vllm:spec_decode_num_draft_tokens_total{{{label}}} {state['draft_tokens']}.0",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{label}}} {state['accepted']}.0"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="{k}"}} {v}.0'
                      for k, v in enumerate(state["per_pos"])]
        return "\n".join(lines) + "\n"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send("")
            elif self.path == "/v1/models":
                self._send(json.dumps({"data": [{"id": model}]}))
            elif self.path == "/metrics":
                self._send(metrics(), "text/plain")
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = _ids(req["prompt"])
            with gate:
                with lock:
                    state["running"] += 1
                time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0.1")))
                out = [(sum(ids) + 7 * i) % 101 for i in range(int(req["max_tokens"]))]
                if spec and os.environ.get("FAKE_VLLM_LOSSY") and out:
                    out[-1] = (out[-1] + 1) % 101
                with lock:
                    state["running"] -= 1
                    if spec:
                        steps = (len(out) + 1) // 2
                        state["drafts"] += steps
                        state["draft_tokens"] += steps * n
                        state["accepted"] += steps
                        state["per_pos"][0] += steps
                    state["served"] += 1
                    dead = die_after and state["served"] > die_after
            if dead:
                print(f"RuntimeError: fake engine core died after {die_after} requests", flush=True)
                os._exit(3)
            self._send(json.dumps({"choices": [{"text": "x" * len(out), "token_ids": out}]}))

    print(f"fake vllm serve {model} on port {port} (n={n})", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def bench(argv: list[str]) -> None:
    import json
    import time
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    base, model = _arg(argv, "--base-url"), _arg(argv, "--model")
    rows = [json.loads(line) for line in Path(_arg(argv, "--dataset-path")).read_text().splitlines() if line]
    rows = rows[: int(_arg(argv, "--num-prompts", len(rows)))]
    out_len = int(_arg(argv, "--custom-output-len"))
    concurrency = int(_arg(argv, "--max-concurrency"))

    def one(row):
        t0 = time.perf_counter()
        try:
            body = json.dumps({"model": model, "prompt": row["prompt"], "max_tokens": out_len}).encode()
            req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                n = len(json.loads(resp.read())["choices"][0]["token_ids"])
            lat = time.perf_counter() - t0
            return lat / 2, lat, n, ""
        except Exception as exc:  # noqa: BLE001 - recorded like vLLM's bench records errors
            return 0.0, 0.0, 0, f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        got = list(pool.map(one, rows))
    duration = time.perf_counter() - t0
    ok = [g for g in got if not g[3]]
    total = sum(g[2] for g in ok)
    result = {"duration": duration, "completed": len(ok), "failed": len(got) - len(ok),
              "total_output_tokens": total, "output_throughput": total / duration,
              "ttfts": [g[0] for g in got], "latencies": [g[1] for g in got], "output_lens": [g[2] for g in got],
              "errors": [g[3] for g in got], "max_concurrent_requests": min(concurrency, len(rows))}
    folder = Path(_arg(argv, "--result-dir", "."))
    (folder / _arg(argv, "--result-filename")).write_text(json.dumps(result))
    print(f"fake bench: {len(ok)}/{len(got)} requests, {total / duration:.1f} tok/s", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["serve"]:
        serve(args[1:])
    elif args[:2] == ["bench", "serve"]:
        bench(args[2:])
    else:
        sys.exit(f"fake vllm: unsupported command {args}")
