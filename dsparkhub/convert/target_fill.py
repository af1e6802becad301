"""Complete a drafter's spec from its target (geometry and keys the source layout does not state) and reduce its
draft vocabulary (``--draft-vocab``), both during planning."""

from __future__ import annotations


from dsparkhub.errors import ConversionRefusedError
from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.layouts.recipes import Recipe
from dsparkhub.target import TargetSpec, hub_id_like, target_repo_id



def check_base_model(base_model: str | None, path) -> None:
    """Refuse a ``--base-model`` that is not a Hub repo id (``namespace/name``, not a local path): it is published.

    Raises:
        ConversionRefusedError: naming the value given.
    """
    if base_model is not None and not hub_id_like(base_model):
        raise ConversionRefusedError(f"--base-model {base_model!r} is not a Hub repo id (namespace/name, not a local "
                                     "path)", path=path, hint="pass the target's Hub repo id, e.g. Qwen/Qwen3-8B")


def verifier_hub_id(spec, t: TargetSpec | None, base_model: str | None, path) -> tuple[str, str]:
    """The Hub repo id a written config names the target by, and how it was found: ``base_model`` (``--base-model``),
    else the target's (:func:`dsparkhub.target.target_repo_id`: Hub source, manifest, config ``_name_or_path``,
    skeleton, matching headers), else the source's own verifier name when that is a Hub id.

    Never a local path: speculators 0.9.0 ``SpeculatorModel.load_verifier_weights`` (speculators/model.py) reads
    the embedding / LM head from ``speculators_config.verifier.name_or_path`` with ``load_model_layers``, which takes a
    local folder as it is and anything else as a Hub repo id (``hf_hub_download``), and vLLM reads the same field;
    a published local path breaks the release for everyone else and tells where files lie on this machine.

    Raises:
        ConversionRefusedError: no Hub id is known (names the flag to give); ``base_model`` is not a Hub repo id.
    """
    if base_model is not None:
        check_base_model(base_model, path)
        return base_model, "--base-model"
    why = "no target was given"
    if t is not None:
        repo, why = target_repo_id(t)
        if repo:
            return repo, why
    own = spec.target_ref.get("name_or_path")
    if hub_id_like(own):
        return own, "the source's speculators_config.verifier.name_or_path"
    why = why.removesuffix("; pass --base-model NS/NAME")
    found = "; the source's own name is not a Hub id" if own else ""
    raise ConversionRefusedError(
        "the output's config names the drafter's target by Hub repo id (speculators_config.verifier.name_or_path: "
        f"speculators and vLLM load the verifier's embedding and LM head from it), and none is known ({why}{found})",
        path=path, hint="pass --base-model NS/NAME (the target's Hub repo id); a local path is never written")


def fill_from_target(spec, t: TargetSpec | None, recipe: Recipe, path, base_model: str | None = None) -> None:
    """Give ``spec`` what the output layout's loader requires and only the target can tell (notes say so).

    - a speculators verifier (``speculators_config.verifier``): speculators 0.9.0 ``VerifierConfig`` needs
      ``architectures`` (a list) and borrows the embedding / LM head from ``name_or_path``, always written as a Hub
      repo id (:func:`verifier_hub_id`); ``architectures`` from the source, else the target's config;
    - ``num_target_layers`` for layouts whose loader reads it (dflash 0.1.0 ``DFlashDraftModel.__init__``).

    Raises:
        ConversionRefusedError: the layout needs one of them, the source does not say it and no target was given;
            or the verifier has no Hub repo id (:func:`verifier_hub_id`).
    """
    if recipe.write_key("verifier_architectures") is not None:
        if t is None and not spec.target_ref.get("architectures"):
            raise ConversionRefusedError(
                f"layout {recipe.name!r} names the drafter's target (speculators_config.verifier: name_or_path and "
                "architectures, required by speculators 0.9.0 VerifierConfig) and the source does not say it",
                path=path, hint="pass --target (its repo id and config architectures are written)")
        repo, how = verifier_hub_id(spec, t, base_model, path)
        if spec.target_ref.get("name_or_path") != repo:
            replaced = ", replacing the source's" if spec.target_ref.get("name_or_path") else ""
            spec.target_ref["name_or_path"] = repo
            spec.notes.append(f"speculators verifier name_or_path: {repo} ({how}{replaced})")
        if not spec.target_ref.get("architectures"):
            archs = list(t.checkpoint.config.get("architectures") or [])
            if not archs:
                raise ConversionRefusedError(f"the target {t.source} names no `architectures` in its config.json; "
                                             "speculators' verifier needs them", path=t.source)
            spec.target_ref["architectures"] = archs
            spec.notes.append(f"speculators verifier architectures taken from the target: {archs}")
    if recipe.data.get("requires_num_target_layers") and spec.num_target_layers is None:
        if t is None:
            raise ConversionRefusedError(
                f"layout {recipe.name!r} needs num_target_layers (dflash 0.1.0 DFlashDraftModel.__init__ reads "
                "config.num_target_layers) and the source does not record it", path=path,
                hint="pass --target (its num_hidden_layers is written)")
        spec.num_target_layers = t.num_hidden_layers
        spec.notes.append(f"num_target_layers taken from the target: {t.num_hidden_layers}")


def reduce_vocab(d: OpenedDraft, t: TargetSpec | None, recipe: Recipe, dv) -> dict:
    """``{canonical name: (dtype, shape, load)}`` for a reduced draft vocab; sets ``d.spec.draft_vocab_size``.

    ``lm_head`` rows come from the drafter's own head, else from the (local) target's; ``markov_w2`` rows from the
    drafter; ``d2t`` (and ``t2d`` where the layout ships it) from the chosen ids.

    Raises:
        ConversionRefusedError: the drafter's vocab is already reduced, or it has no LM head and the target's
            cannot be read.
    """
    import torch

    spec = d.spec
    if spec.draft_vocab_size != spec.vocab_size or "d2t" in spec.tensors:
        raise ConversionRefusedError(f"the drafter's draft vocab is already reduced ({spec.draft_vocab_size} of "
                                     f"{spec.vocab_size}); --draft-vocab starts from a full-vocab drafter",
                                     path=d.checkpoint.path)
    ids = torch.tensor(dv.ids, dtype=torch.int64)
    n = dv.size

    def rows(load):
        return lambda: load().index_select(0, ids).contiguous()

    out = {}
    head = spec.tensors.get("lm_head.weight")
    if head is not None:
        out["lm_head.weight"] = (head.dtype, (n, head.shape[1]),
                                 rows(lambda: d.checkpoint.read_tensor(spec.source_names["lm_head.weight"])))
    elif t is not None and t.local and t.lm_head is not None:
        ref = t.lm_head
        out["lm_head.weight"] = (ref.dtype, (n, ref.shape[1]), rows(lambda: t.checkpoint.read_tensor(ref.name)))
    else:
        raise ConversionRefusedError("the drafter has no LM head of its own and the target's cannot be read (a "
                                     "local target is needed): a reduced draft vocab needs lm_head rows",
                                     path=d.checkpoint.path)
    w2 = spec.tensors.get("markov_head.markov_w2.weight")
    if w2 is not None:
        out["markov_head.markov_w2.weight"] = (
            w2.dtype, (n, w2.shape[1]),
            rows(lambda: d.checkpoint.read_tensor(spec.source_names["markov_head.markov_w2.weight"])))
    out["d2t"] = ("I64", (n,), dv.d2t)
    if "t2d" in ((recipe.data.get("write") or {}).get("derive") or []):
        out["t2d"] = ("BOOL", (spec.vocab_size,), dv.t2d)
    spec.draft_vocab_size = n
    return out


