"""Multi-step flows over typed values: the quickstart (build the example -> inspect -> convert -> validate -> verify
-> card -> push). The CLI only parses options and prints what each step hands back (``dsparkhub quickstart``).

A flow reports progress through two callbacks: ``starting(step)`` before a step runs and ``finished(step, state)``
after it, with the :class:`Quickstart` state filled so far. Step names are :data:`QUICKSTART_STEPS`, plus
``"local_hub"`` (finished only) when the push goes to a local Hub started for the occasion, before the push itself.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dsparkhub.card.facts import CardOutput
from dsparkhub.card.render import write_card
from dsparkhub.convert import ConversionResult, convert
from dsparkhub.example import Example, build_example
from dsparkhub.hub.push import PushReport, push
from dsparkhub.layouts.reading import OpenedDraft, open_draft
from dsparkhub.validate.record import validate_reusing
from dsparkhub.validate.report import ValidationReport
from dsparkhub.verify.results.schema import VerifyResults
from dsparkhub.verify.runner import run_verify
from dsparkhub.verify.settings import LoadOptions, VerifySettings

QUICKSTART_STEPS = ("example", "inspect", "convert", "validate", "verify", "card", "push")
#: the quickstart's drafter folder inside OUTDIR, and the ids its card and the local Hub use.
QUICKSTART_DRAFTER = "example-qwen3-dspark"
QUICKSTART_REPO = "dsparkhub-example/qwen3-tiny-dspark"
QUICKSTART_BASE_MODEL = "dsparkhub-example/qwen3-tiny"
#: the local Hub's one token (a fake, valid-looking value; the Hub lives for the duration of the push).
LOCAL_HUB_TOKEN = "hf_quickstartLocalHubToken00000000"


@dataclass
class Quickstart:
    """What the quickstart has done so far; a field is None until its step ran.

    Attributes:
        outdir: the output folder (created).
        example: the embedded example's paths (target, DeepSpec run, prompts).
        source: the training output, opened from its headers (step ``inspect``).
        conversion: what ``convert`` wrote into ``drafter``.
        report: the validation of ``drafter`` against the example target at n = 7 (from convert's record,
            ``validation.json``: the output is validated once, by convert, and that record is handed on).
        results_path / results: the verify results file (reference engine, n = 3, 5, 7) and its contents.
        card: the model card and plots written into ``drafter``.
        hub_url: the local Hub's URL (None when ``repo_id`` asked for a dry run against the real Hub).
        push: the push report (a dry run when ``repo_id`` was given).
    """

    outdir: Path
    example: Example | None = None
    source: OpenedDraft | None = None
    conversion: ConversionResult | None = None
    report: ValidationReport | None = None
    results_path: Path | None = None
    results: VerifyResults | None = None
    card: CardOutput | None = None
    hub_url: str | None = None
    push: PushReport | None = None

    @property
    def drafter(self) -> Path:
        """The converted drafter folder, ``outdir / QUICKSTART_DRAFTER``."""
        return self.outdir / QUICKSTART_DRAFTER

    @property
    def ok(self) -> bool:
        """True when every step ran (False when validation found errors and the flow stopped there)."""
        return self.push is not None


def _nothing(*_args) -> None:
    return None


def quickstart(outdir: str | Path, *, repo_id: str | None = None, max_new_tokens: int = 96, progress: bool = True,
               starting: Callable[[str], None] = _nothing,
               finished: Callable[[str, Quickstart], None] = _nothing, on_plan: Callable | None = None) -> Quickstart:
    """Run the main job on the embedded example; re-running replaces OUTDIR's contents.

    Args:
        outdir: output folder (created; the drafter goes to ``outdir/example-qwen3-dspark``, results to
            ``outdir/results.json``).
        repo_id: plan a push to this real Hub repo (dry run: read requests only) instead of pushing to a local Hub.
        max_new_tokens: tokens generated per prompt by verify.
        progress: progress bars during verify.
        starting / finished: progress callbacks (see the module docstring).
        on_plan: handed to :func:`dsparkhub.hub.push.push` for the local-Hub push: called with the plan before
            anything is uploaded (the CLI prints it there, as ``dsparkhub push`` does).

    Returns:
        The :class:`Quickstart` state; ``ok`` is False when validation found errors (the flow stops after it).

    Raises:
        The errors of each step's library function (``DsparkhubError`` subclasses; ``HubError`` from the push).
    """
    state = Quickstart(Path(outdir))
    state.outdir.mkdir(parents=True, exist_ok=True)
    starting("example")
    state.example = ex = build_example()
    finished("example", state)
    starting("inspect")
    state.source = open_draft(ex.deepspec_run)
    finished("inspect", state)
    starting("convert")
    state.conversion = convert(ex.deepspec_run, state.drafter, ex.target, overwrite=True)
    finished("convert", state)
    starting("validate")
    # convert validated its output once (validation.json); this step applies n = 7 to that record, and verify /
    # push below take the same record (each checks its key against the folder, header-only)
    record = getattr(state.conversion, "validation", None)
    state.report, _ = validate_reusing(state.drafter, ex.target, record=record, num_speculative_tokens=7)
    finished("validate", state)
    if not state.report.ok:
        return state
    starting("verify")
    state.results_path = state.outdir / "results.json"
    state.results = run_verify(state.drafter, ex.target,
                               VerifySettings(num_speculative_tokens=(3, 5, 7), datasets=[f"heldout={ex.prompts}"],
                                              max_new_tokens=max_new_tokens,
                                              load=LoadOptions(repeats=3)),  # interleaved, medians: honest timing
                               backend="reference", out=state.results_path, overwrite=True, progress=progress,
                               validation=record)
    finished("verify", state)
    starting("card")
    # the example target lives only on this machine: the card names it by the id the local Hub below would give it
    state.card = write_card(state.drafter, [state.results_path], repo_id=QUICKSTART_REPO,
                            base_model=QUICKSTART_BASE_MODEL)
    finished("card", state)
    starting("push")
    if repo_id:
        state.push = push(state.drafter, repo_id, dry_run=True, target=str(ex.target), validation_record=record)
    else:
        # the in-process Hub of dsparkhub.testing: imported only here, the library never needs it otherwise
        from dsparkhub.testing.hub_server.hub import LocalHub

        with tempfile.TemporaryDirectory(prefix="dsparkhub-localhub-") as hub_root, \
                LocalHub(hub_root, tokens={LOCAL_HUB_TOKEN: "dsparkhub-example"}) as hub, hub.client_settings():
            state.hub_url = hub.url
            finished("local_hub", state)
            state.push = push(state.drafter, QUICKSTART_REPO, token=LOCAL_HUB_TOKEN, endpoint=hub.url,
                              target=str(ex.target), validation_record=record, on_plan=on_plan)
    finished("push", state)
    return state
