"""Crash safety of everything that writes: ``convert`` and ``convert --attach`` killed with SIGKILL at every write
step, two runs racing for the same OUT, and a full disk.

The kill points come from the ``DSPARKHUB_TEST_KILL_AT=<n>`` hook in ``dsparkhub.io.output.kill_point`` (every shard
header, every tensor, every JSON file, every rename of the output folder). After each kill: the source drafter and
the target are byte-identical to before (sha256 of every file, symlinks included) and OUT is absent or complete
(same files and bytes as an uninterrupted run, and it opens and validates) — never half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from dsparkhub.io.checkpoint import open_checkpoint
from dsparkhub.errors import OutputExistsError
from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target, make_v4_target
from dsparkhub.validate import validate
from dsparkhub.io.output import atomic_output

torch.set_num_threads(1)

#: totals over this module, printed when the module's tests end (run with -s to see them).
TOTALS: Counter = Counter()
#: small shards so that a conversion has many write steps to interrupt.
SHARD = "8000"
#: files whose content records the time of the run (compared for presence and JSON validity, not bytes).
TIMESTAMPED = {"dsparkhub_provenance.json", "dsparkhub_attach.json"}


@pytest.fixture(scope="module", autouse=True)
def _print_totals():
    yield
    if TOTALS:
        print(f"\ncrash safety totals: {dict(TOTALS)}")


def tree(folder: Path) -> dict[str, str]:
    """``{relative path: sha256 | 'link -> target' | 'dir'}`` of everything under ``folder``."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = f"link -> {os.readlink(p)}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "DSPARKHUB_DEBUG": "0", **(env or {})}
    for k in ("DSPARKHUB_TEST_KILL_AT", "DSPARKHUB_TEST_KILL_LOG"):
        if k not in (env or {}):
            full_env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "dsparkhub.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=120, **kw)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash_models")
    target = make_qwen3_target(root / "target")
    run = make_deepspec_drafter(root / "run", target)
    v4 = make_v4_target(root / "v4")
    attach_run = make_deepspec_drafter(root / "attach_run", target, drop=("embed_tokens.weight", "lm_head.weight"))
    return {"target": target, "run": run, "v4": v4, "attach_run": attach_run}


def _kill_points(args: list[str], tmp: Path) -> list[str]:
    log = tmp / "kill_points.log"
    log.unlink(missing_ok=True)
    p = cli(*args, env={"DSPARKHUB_TEST_KILL_LOG": str(log)})
    assert p.returncode == 0, p.stderr
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines()]


def _state_of(out: Path, reference: dict[str, str]) -> str:
    """'absent' or 'complete'; fails on anything in between."""
    if not out.exists() and not out.is_symlink():
        return "absent"
    got = tree(out)
    assert set(got) == set(reference), f"OUT is half-written: {sorted(set(reference) ^ set(got))}"
    for rel, digest in reference.items():
        if rel in TIMESTAMPED:
            json.loads((out / rel).read_text())
        else:
            assert got[rel] == digest, f"{rel} differs from an uninterrupted run"
    open_checkpoint(out, require_config=False)
    return "complete"


def _kill_everywhere(models, tmp: Path, make_args, *, validate_out: bool, label: str) -> Counter:
    """Run ``make_args(out)`` once to count its kill points, then once per point with SIGKILL there."""
    sources = {k: tree(v) for k, v in models.items()}
    reference_out = tmp / "reference"
    points = _kill_points(make_args(reference_out), tmp)
    assert len(points) >= 10, points
    reference = tree(reference_out)
    outcomes: Counter = Counter()
    for n, point in enumerate(points, start=1):
        out = tmp / f"out{n}"
        p = cli(*make_args(out), env={"DSPARKHUB_TEST_KILL_AT": str(n)})
        assert p.returncode == -signal.SIGKILL, (n, point, p.returncode, p.stderr[-2000:])
        state = _state_of(out, reference)
        outcomes[state] += 1
        for name, before in sources.items():
            assert tree(models[name]) == before, f"{name} changed after a kill at point {n} ({point})"
        if state == "absent" and (n % 8 == 1 or n == len(points) - 1):
            # a crashed run's leftovers never block the next run, which completes
            again = cli(*make_args(out))
            assert again.returncode == 0, again.stderr
            assert _state_of(out, reference) == "complete"
            assert not list(tmp.glob(f".{out.name}.tmp-*")), "the killed run's temporary folder was not cleaned"
            outcomes["re-run completed"] += 1
        if state == "complete" and validate_out:
            assert validate(out, str(models["target"])).ok
    # the last points come after the rename; every earlier one leaves no OUT
    assert outcomes["complete"] >= 1 and outcomes["absent"] >= len(points) - 2, outcomes
    TOTALS[f"{label} kill points"] += len(points)
    print(f"{label}: {len(points)} kill points -> {dict(outcomes)}")
    return outcomes


@pytest.mark.slow
def test_convert_killed_at_every_write_step(models, tmp_path):
    _kill_everywhere(models, tmp_path, lambda out: ["convert", str(models["run"]), "--target", str(models["target"]),
                                                    "--out", str(out), "--max-shard-size", SHARD],
                     validate_out=True, label="convert")


@pytest.mark.slow
def test_attach_killed_at_every_write_step(models, tmp_path):
    # --force: the toy drafter is a Qwen3 one (DSH311 against a V4 target); this test is about the writes
    _kill_everywhere(models, tmp_path, lambda out: ["convert", str(models["attach_run"]), "--attach",
                                                    str(models["v4"]), "--out", str(out), "--max-shard-size", SHARD,
                                                    "--force"],
                     validate_out=False, label="attach")


@pytest.mark.slow
def test_overwrite_killed_at_every_step_keeps_old_or_new(models, tmp_path):
    """``--overwrite`` of an existing OUT: after a kill, OUT is the old output, the new one, or (only in the instant
    between its two renames) absent with the old one intact next to it — never a mix."""
    # bigger shards than the other tests (fewer points): the renames at the end are what this test is about
    base = ["convert", str(models["run"]), "--target", str(models["target"]), "--max-shard-size", "40000"]
    old_ref, new_ref = tmp_path / "old_ref", tmp_path / "new_ref"
    assert cli(*base, "--keep-embeddings", "--out", str(old_ref)).returncode == 0
    points = _kill_points([*base, "--out", str(new_ref)], tmp_path)
    old, new = tree(old_ref), tree(new_ref)
    assert old != new
    outcomes: Counter = Counter()
    for n in range(1, len(points) + 2):  # + 1: the point after the old OUT is moved aside
        out = tmp_path / f"out{n}"
        shutil.copytree(old_ref, out)
        p = cli(*base, "--out", str(out), "--overwrite", env={"DSPARKHUB_TEST_KILL_AT": str(n)})
        if p.returncode == 0:
            break  # ran out of points
        assert p.returncode == -signal.SIGKILL, p.stderr
        if not out.exists():
            aside = list(tmp_path.glob(f".out{n}.old-*"))
            assert len(aside) == 1 and _state_of(aside[0], old) == "complete"
            outcomes["absent, old kept aside"] += 1
            continue
        got = tree(out)
        same = {rel for rel in got if rel not in TIMESTAMPED and got[rel] == old.get(rel)}
        state = "old" if same == set(old) - TIMESTAMPED else "new"
        _state_of(out, old if state == "old" else new)  # and complete: no mix of the two
        outcomes[state] += 1
    assert outcomes["old"] >= 1 and outcomes["new"] >= 1, outcomes
    TOTALS["overwrite kill points"] += sum(outcomes.values())
    print(f"overwrite: {sum(outcomes.values())} kill points -> {dict(outcomes)}")


def test_two_writers_of_one_out_one_wins_in_process(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OutputExistsError, match="another run"):
        with atomic_output(out) as tmp_a:
            (tmp_a / "who").write_text("a")
            with atomic_output(out) as tmp_b:
                (tmp_b / "who").write_text("b")
    assert (out / "who").read_text() == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the loser left its temporary folder behind"


def test_only_dead_runs_temporary_folders_are_removed(tmp_path):
    from dsparkhub.io.output import _host_tag

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = _host_tag()
    mine = tmp_path / f".out.tmp-{host}-{os.getpid()}-aaaa"  # a live process (this one)
    killed = tmp_path / f".out.tmp-{host}-{dead.pid}-bbbb"
    elsewhere = tmp_path / f".out.tmp-otherhost{host}-{dead.pid}-cccc"  # another host on a shared filesystem
    other_out = tmp_path / f".out2.tmp-{host}-{dead.pid}-dddd"
    for p in (mine, killed, elsewhere, other_out):
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"partial")
    with atomic_output(tmp_path / "out") as tmp:
        (tmp / "config.json").write_text("{}")
    assert not killed.exists()
    assert mine.exists() and elsewhere.exists() and other_out.exists()
    assert (tmp_path / "out" / "config.json").exists()


@pytest.mark.slow
def test_two_concurrent_converts_to_one_out(models, tmp_path):
    args = ["convert", str(models["run"]), "--target", str(models["target"]), "--max-shard-size", SHARD]
    ref = tmp_path / "ref"
    assert cli(*args, "--out", str(ref)).returncode == 0
    reference = tree(ref)
    for attempt in range(3):
        out = tmp_path / f"race{attempt}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DSPARKHUB_TEST_")}
        procs = [subprocess.Popen([sys.executable, "-m", "dsparkhub.cli", *args, "--out", str(out)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        codes = sorted(rc for rc, _ in results)
        assert codes == [0, 1], results
        loser = next(err for rc, err in results if rc == 1)
        assert "OutputExistsError" in loser and str(out) in loser, loser
        assert "Traceback" not in loser
        assert _state_of(out, reference) == "complete"
        assert not list(tmp_path.glob(f".race{attempt}.tmp-*")), "the loser left its temporary folder behind"
        TOTALS["concurrent races"] += 1


def _small_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_full_disk_gives_a_clear_error_and_no_partial_out(models, tmp_path):
    disk = tmp_path / "disk"
    mounted = _small_tmpfs(disk, "32k")
    out = disk / "out"
    args = ["convert", str(models["run"]), "--target", str(models["target"]), "--out", str(out)]
    sources = {k: tree(v) for k, v in models.items()}
    try:
        if mounted:
            p = cli(*args)
        else:  # no tmpfs here: the same failure through a file-size limit (EFBIG instead of ENOSPC)
            p = cli(*args, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10)))
        assert p.returncode == 1, (p.returncode, p.stderr)
        err = p.stderr
        assert ("No space left on device" if mounted else "File too large") in err, err
        assert str(out) in err, f"the error does not say which output failed: {err}"
        assert "Traceback" not in err
        assert not out.exists()
        assert list(disk.iterdir()) == [], f"partial output left behind: {list(disk.iterdir())}"
        assert {k: tree(v) for k, v in models.items()} == sources
        TOTALS["full-disk faults"] += 1
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=False)


# ---- interrupted pushes: a fault at every request of a real push --------------------------------------------------

FAKE_TOKEN = "hf_FAKEdsparkhubTOKENcrash0123456789"


@pytest.fixture
def fresh_hub(tmp_path, monkeypatch):
    """A factory of LocalHub servers (one per case: LFS objects are deduplicated server-wide, so a server that saw a
    shard once would skip its upload and the fault on it)."""
    from contextlib import ExitStack

    import huggingface_hub.utils._http as http

    from dsparkhub.testing import LocalHub

    monkeypatch.setattr(http.time, "sleep", lambda s: None)  # huggingface_hub's retry back-off
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    servers = []
    with ExitStack() as stack:
        def make():
            server = stack.enter_context(LocalHub(tmp_path / f"hub{len(servers)}", tokens={FAKE_TOKEN: "alice"}))
            stack.enter_context(server.client_settings())
            servers.append(server)
            return server
        yield make
    assert all(s.server_errors == [] for s in servers)


def _remote(hub, repo: str) -> dict[str, bytes] | None:
    try:
        files = hub.files(repo)
    except KeyError:
        return None
    files.pop(".gitattributes", None)
    return files


def _local(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _pattern(path: str) -> str:
    """A regex for ``path`` with commit / LFS ids generalised (they differ between servers)."""
    path = re.escape(path.split("?")[0])
    return "^" + re.sub(r"[0-9a-f]{64}", "[0-9a-f]{64}", re.sub(r"(?<![0-9a-f])[0-9a-f]{40}(?![0-9a-f])",
                                                                 "[0-9a-f]{40}", path)) + "$"


@pytest.mark.slow
def test_push_fault_at_every_request_never_leaves_a_partial_release(models, tmp_path, fresh_hub):
    """For every kind of request a real push sends, each fault (on writes: HTTP 500, 503, 401, 403 and a dropped
    connection — mid-body for LFS uploads; on reads: 500 and a drop), on a new repo and on an update of an older
    release: the remote is the old release or the complete new one, never a mix; the error is a HubError without
    the token; a re-run completes."""
    from dsparkhub.errors import HubError
    from dsparkhub.hub.push import push

    target = str(models["target"])
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    for out, extra in ((old_dir, ["--keep-embeddings"]), (new_dir, [])):
        p = cli("convert", str(models["run"]), "--target", target, "--out", str(out), "--max-shard-size", SHARD,
                *extra)
        assert p.returncode == 0, p.stderr
    new, old = _local(new_dir), _local(old_dir)
    assert new != old

    def prepare(start: str):
        hub = fresh_hub()
        if start == "old release":  # server-side, no HTTP: the older release a user pushed last week
            hub.create_repo(repo)
            hub.put_files(repo, old)
        return hub

    outcomes: Counter = Counter()
    case = 0
    repo = "alice/tiny-dspark"
    for start in ("absent", "old release"):
        hub = prepare(start)
        # delete=["*"]: a new release replaces the old one (hf upload keeps remote-only files otherwise)
        push(new_dir, repo, target=target, validate=False, endpoint=hub.url, delete=["*"])
        assert _remote(hub, repo) == new
        sent = list(dict.fromkeys((r.method, _pattern(r.path), r.is_write) for r in hub.requests))
        assert any("commit" in p for _, p, _ in sent), sent
        # (an update whose shards the Hub already holds sends no LFS upload at all)
        assert start != "absent" or any(m == "PUT" for m, _, _ in sent), sent
        for method, pattern, is_write in sent:
            kinds = ([("status", 500), ("status", 503), ("status", 401), ("status", 403), ("drop", None)]
                     if is_write else [("status", 500), ("drop", None)])
            for kind, status in kinds:
                case += 1
                hub = prepare(start)
                before = _remote(hub, repo)
                fault = hub.inject(method=method, path=pattern, kind=kind, status=status or 500, count=None)
                try:
                    push(new_dir, repo, target=target, validate=False, endpoint=hub.url, delete=["*"])
                    result = "pushed"
                except HubError as exc:
                    assert FAKE_TOKEN not in str(exc) and FAKE_TOKEN not in str(exc.hint)
                    result = "HubError"
                hub.clear_faults()
                assert fault.hits, f"the fault on {method} {pattern} was never reached"
                after = _remote(hub, repo)
                if before is None and after == {}:
                    after = None  # the repo was created but nothing committed: still no release
                assert after in (before, new), f"partial release after {kind} {status} on {method} {pattern}"
                outcomes[f"{result}, remote {'unchanged' if after == before else 'complete'}"] += 1
                if after != new:
                    push(new_dir, repo, target=target, validate=False, endpoint=hub.url, delete=["*"])  # re-run completes
                    assert _remote(hub, repo) == new
                    outcomes["re-run completed"] += 1
    assert outcomes["HubError, remote unchanged"] > 0
    injected = case
    TOTALS["push faults injected"] += injected
    print(f"push: {injected} faults injected -> {dict(outcomes)}")
