"""The embedded example: a tiny Qwen3 target and two drafters really trained on it, shipped with the package.

Training is seeded, but float results differ across CPUs: the same build gave τ 2.57 at n = 7 on one machine and 2.47
on another. So the example is trained once (``python scripts/build_example.py --from-scratch --ship``, see
:mod:`dsparkhub.example.train`) and its files ship in ``dsparkhub/data/example/`` (17 MB of float32 weights; the
training run's optimizer state is left out): every machine measures the same weights, and the numbers the docs quote
are those of the shipped ``info.json``.

:func:`build_example` lays the shipped files out in their real layouts under the cache (``$DSPARKHUB_CACHE``, default
``~/.cache/dsparkhub``), in well under a second: an HF target folder, a DeepSpec run folder (``step_<N>/`` with a
relative ``step_latest`` link and a small stand-in ``training_state.rank0.pt``, since DeepSpec step folders hold
one and dsparkhub must leave it out), a z-lab DFlash folder, the held-out prompts and ``info.json``. With
``from_scratch=True`` it trains a new build instead (minutes). Either way the folder is written in a temp folder and
renamed into place, one builder per key at a time. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from filelock import FileLock

from dsparkhub.errors import CheckpointNotFoundError, OutputExistsError

# The trainer and the layout writers import torch and transformers (seconds): loaded on first use, so laying out
# the shipped example costs no import of either.
_LAZY = {"EXAMPLE_RECIPE": "train", "SPECIAL_TOKENS": "corpus", "measure_example": "train",
         "train_example_into": "train", "dflash_config_dict": "layouts", "dspark_config_dict": "layouts",
         "make_tiny_drafter": "layouts", "make_tiny_target": "layouts", "save_deepspec_step": "layouts"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["Example", "build_example", "example_cache_root", "example_key", "shipped_example_dir", "shipped_key",
           "EXAMPLE_RECIPE", "SPECIAL_TOKENS", "dflash_config_dict", "dspark_config_dict", "make_tiny_drafter",
           "make_tiny_target", "measure_example", "save_deepspec_step", "train_example_into"]

#: Files of the shipped build, relative to ``dsparkhub/data/example/`` (``dspark_step/`` becomes the DeepSpec step).
SHIPPED_FILES = ("info.json", "prompts.jsonl",
                 "target/config.json", "target/generation_config.json", "target/model.safetensors",
                 "target/tokenizer.json", "target/tokenizer_config.json", "target/chat_template.jinja",
                 "dspark_step/config.json", "dspark_step/model.safetensors", "dspark_step/train_config.py",
                 "dflash_drafter/config.json", "dflash_drafter/model.safetensors")


@dataclass
class Example:
    """Paths of a laid-out example.

    Attributes:
        root: the cache folder of this build.
        target: HF target folder (config.json, model.safetensors, tokenizer files with a chat template).
        deepspec_run: DeepSpec run dir holding ``step_<N>/`` and the relative ``step_latest`` symlink.
        dspark_step: the ``step_<N>`` folder of the DSpark drafter.
        dflash: z-lab DFlash drafter folder (``DFlashDraftModel``, ``dflash_config``).
        prompts: held-out evaluation prompts, JSONL lines ``{"prompt": "..."}``.
        info: sizes, parameter counts, training seconds per phase, measured τ per n (``info.json``).
    """

    root: Path
    target: Path
    deepspec_run: Path
    dspark_step: Path
    dflash: Path
    prompts: Path
    info: dict


def example_cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$DSPARKHUB_CACHE``, else ``~/.cache/dsparkhub``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("DSPARKHUB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "dsparkhub"


def shipped_example_dir() -> Path:
    """The folder of the shipped build inside the installed package (``dsparkhub/data/example``)."""
    return Path(str(resources.files("dsparkhub") / "data" / "example"))


def shipped_key(folder: Path | None = None) -> str:
    """16 hex digits identifying the shipped build: sha256 over its files' names and bytes (~10 ms for 17 MB).

    Raises:
        CheckpointNotFoundError: a file of :data:`SHIPPED_FILES` is missing (a broken install).
    """
    folder = folder or shipped_example_dir()
    h = hashlib.sha256()
    for rel in SHIPPED_FILES:
        path = folder / rel
        if not path.is_file():
            raise CheckpointNotFoundError(f"the shipped example lacks {rel}; reinstall dsparkhub, or build one with "
                                          "`dsparkhub example build --from-scratch`", path=path)
        h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def example_key() -> str:
    """16 hex digits identifying a from-scratch build: the sources of the trainer (corpus, batches, training) and of
    the reference drafter (configuration, layers, modeling, loading), the recipe, versions."""
    import tokenizers
    import torch
    import transformers

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    reference = here.parent / "verify" / "reference"
    for path in (here / "corpus.py", here / "batches.py", here / "train.py", reference / "drafter_config.py",
                 reference / "layers.py", reference / "modeling.py", reference / "loading.py"):
        h.update(path.read_bytes())
    from dsparkhub.example.train import EXAMPLE_RECIPE

    h.update(json.dumps(EXAMPLE_RECIPE, sort_keys=True).encode())
    h.update(f"{sys.version_info[:2]} {torch.__version__} {transformers.__version__} "
             f"{tokenizers.__version__}".encode())
    return h.hexdigest()[:16]


def build_example(cache_dir: str | Path | None = None, *, force: bool = False, from_scratch: bool = False,
                  progress: Callable[[str], None] | None = None) -> Example:
    """Lay out the shipped example in the cache (or train a new one) and return its paths.

    Args:
        cache_dir: cache root (default ``$DSPARKHUB_CACHE`` or ``~/.cache/dsparkhub``).
        force: redo the folder even if a complete one with the same key exists.
        from_scratch: train a new build (minutes on 2 cores; τ then differs a little from the shipped one, by CPU)
            into ``example-trained-<example_key()>`` instead of laying out ``example-<shipped_key()>``.
        progress: called with one line of text per training phase and every 20 steps (from-scratch builds only).

    Returns:
        :class:`Example` with the paths and ``info``.

    Raises:
        CheckpointNotFoundError: the shipped files are missing (a broken install).
        DsparkhubError: from scratch: the standard library sources are missing (the training corpus).
        OutputExistsError: the finished folder cannot be moved into place.
        OSError: the cache folder cannot be written.
    """
    root = example_cache_root(cache_dir)
    if from_scratch:
        final = root / f"example-trained-{example_key()}"

        def builder(tmp: Path) -> None:
            # looked up on the module at call time (lazily imported; tests stand a fake trainer in)
            sys.modules[__name__].train_example_into(tmp, progress=progress)
    else:
        final = root / f"example-{shipped_key()}"
        builder = _lay_out_shipped
    if _complete(final) and not force:
        return _load_built(final)
    root.mkdir(parents=True, exist_ok=True)
    # One builder per key at a time: concurrent callers (parallel test sessions, a quickstart next to the tests)
    # wait for the first one instead of each writing the same folder.
    with FileLock(str(root / f".{final.name}.lock")):
        if _complete(final) and not force:
            return _load_built(final)
        return _build_locked(root, final, builder, force)


def _complete(folder: Path) -> bool:
    return folder.is_dir() and (folder / "info.json").is_file()


def _load_built(root: Path) -> Example:
    info = json.loads((root / "info.json").read_text())
    run = root / "deepspec_run"
    return Example(root=root, target=root / "target", deepspec_run=run, dspark_step=run / info["dspark_step"],
                   dflash=root / "dflash_drafter", prompts=root / "prompts.jsonl", info=info)


def _lay_out_shipped(out: Path) -> None:
    """Copy the shipped files into ``out`` in their real layouts (DeepSpec step folder + ``step_latest``)."""
    import torch

    src = shipped_example_dir()
    info = json.loads((src / "info.json").read_text())
    step = out / "deepspec_run" / info["dspark_step"]
    for rel in SHIPPED_FILES:
        dest = step / rel.split("/", 1)[1] if rel.startswith("dspark_step/") else out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dest)
    # DeepSpec writes its optimizer / RNG state next to the weights; the shipped build leaves the real one out (it
    # is training state, 8 MB), so a small stand-in keeps the layout honest for convert / push, which must skip it.
    torch.save({"optimizer": {}, "next_micro_step": int(info["dspark_step"].split("_")[-1]), "world_size": 1},
               step / "training_state.rank0.pt")
    (out / "deepspec_run" / "step_latest").symlink_to(step.name)


def _build_locked(root: Path, final: Path, builder: Callable[[Path], None], force: bool) -> Example:
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        builder(tmp)
        if final.exists():
            if not force and _complete(final):  # a concurrent build won; keep its copy
                shutil.rmtree(tmp, ignore_errors=True)
                return _load_built(final)
            old = root / f".{final.name}.old-{os.getpid()}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError as exc:
            if _complete(final):
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                raise OutputExistsError(f"could not move the example into {final}: {exc}", path=final) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _load_built(final)


def ship(example: Example, dest: Path | None = None) -> Path:
    """Write a from-scratch build's files as the shipped example (``dsparkhub/data/example/``), atomically.

    The τ in its ``info.json`` were measured by :func:`measure_example` from exactly these bytes.

    Args:
        example: a build made with ``build_example(from_scratch=True)``.
        dest: where to write (default :func:`shipped_example_dir`, the package's own data folder).

    Returns:
        ``dest``.
    """
    dest = Path(dest) if dest is not None else shipped_example_dir()
    tmp = Path(tempfile.mkdtemp(prefix=".example.tmp-", dir=dest.parent))
    tmp.chmod(0o755)  # package data: readable by every user (mkdtemp makes it 0700)
    try:
        for rel in SHIPPED_FILES:
            src = example.dspark_step / rel.split("/", 1)[1] if rel.startswith("dspark_step/") else example.root / rel
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / rel)
        info = json.loads((tmp / "info.json").read_text())
        info["key"] = example.root.name
        (tmp / "info.json").write_text(json.dumps(info, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def main(argv: list[str] | None = None) -> int:  # used by scripts/build_example.py
    """Lay out (or train, and optionally ship) the example and print its info (``scripts/build_example.py``)."""
    import argparse

    parser = argparse.ArgumentParser(description="Build the dsparkhub embedded example.")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--force", action="store_true", help="redo the cached folder")
    parser.add_argument("--from-scratch", action="store_true", help="train a new build (minutes)")
    parser.add_argument("--ship", action="store_true", help="with --from-scratch: write it to dsparkhub/data/example")
    args = parser.parse_args(argv)
    if args.ship and not args.from_scratch:
        parser.error("--ship needs --from-scratch")
    ex = build_example(args.cache_dir, force=args.force, from_scratch=args.from_scratch,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    report = {"root": str(ex.root), "seconds": ex.info["seconds"], "tau": ex.info["tau"], "sizes": ex.info["sizes"]}
    if args.ship:
        report["shipped"] = str(ship(ex))
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0
