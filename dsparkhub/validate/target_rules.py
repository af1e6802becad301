"""Rules of a drafter against its target: geometry, vocab, embeddings / LM head, layer ids, final layer, family."""

from __future__ import annotations

from pathlib import Path

from dsparkhub.layouts.families import family_of_target
from dsparkhub.layouts.manifests import get_manifest
from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.target import TargetSpec
from dsparkhub.validate.report import Collector
from dsparkhub.validate.settings import FinalLayer


def check_target(d: OpenedDraft, t: TargetSpec, out: Collector) -> FinalLayer | None:
    """Every rule of the drafter against its target that does not depend on the engine.

    Returns:
        the facts of the engine-dependent final-layer rule (DSH304 / DSH313, applied by
        :func:`dsparkhub.validate.settings.settings_findings`) when the ids include the target's last layer and none
        lies outside it; else None.
    """
    spec = d.spec
    final = None
    cfg_file = str(Path(d.checkpoint.path) / "config.json")
    if spec.target_hidden_size != t.hidden_size:
        out.add("DSH301", "the drafter was built for a target with another hidden size",
                location=f"{cfg_file} key target_hidden_size/hidden_size", expected=t.hidden_size,
                found=spec.target_hidden_size, hint=f"is {t.source} the target this drafter was trained on?")
    if spec.vocab_size != t.vocab_size:
        out.add("DSH302", "the drafter's input vocab differs from the target's", location=f"{cfg_file} key vocab_size",
                expected=t.vocab_size, found=spec.vocab_size, hint=f"is {t.source} the right target?")
    if spec.draft_vocab_size > t.vocab_size:
        out.add("DSH205", "draft vocab larger than the target vocab", location=f"{cfg_file} key draft_vocab_size",
                expected=f"<= {t.vocab_size}", found=spec.draft_vocab_size)
    check_family(d, t, out)
    L = t.num_hidden_layers
    ids = spec.target_layer_ids
    outside = [i for i in ids if not -1 <= i < L]
    if outside:
        hint = ""
        if max(ids) == L and all(-1 <= i - 1 < L for i in ids):
            hint = (f"ids {ids} look like hidden-state indices (layer index + 1); in layer-index numbering "
                    f"they are {[i - 1 for i in ids]}, which include the target's last layer {L - 1}: its state is "
                    "pre-norm in vLLM but normed in HF output_hidden_states (DSH304 for the reference engine, "
                    "DSH313 for vLLM); ids that stop at layer " + str(L - 2) + " read the same everywhere")
        out.add("DSH303", f"target layer ids {outside} are outside the target's {L} layers",
                location=f"{cfg_file} key target_layer_ids", expected=f"-1 <= id <= {L - 2}", found=ids,
                hint=hint or "layer ids are 0-based decoder-layer indices")
    elif L - 1 in ids:
        final = FinalLayer(target_layers=L, trained=d.recipe.data.get("final_layer_state", "raw"),
                           sources=d.recipe.data.get("final_layer_state_source") or "")
    if spec.num_target_layers is not None \
            and d.recipe.typed.records_target_layer_count \
            and spec.num_target_layers != L:
        out.add("DSH306", "the drafter records a target with another number of layers",
                location=f"{cfg_file} key num_target_layers", expected=L, found=spec.num_target_layers,
                hint=f"is {t.source} the target this drafter was trained on?")
    named = spec.target_ref.get("name_or_path")
    repo = None
    if t.manifest:
        repo = get_manifest(t.manifest).repo_id
    elif not t.local:
        repo = t.source.partition("@")[0]
    if named and repo and named.rstrip("/").lower() != repo.lower():
        out.add("DSH310", f"the drafter's config names its target (verifier) {named!r}, but it is checked against "
                f"{repo!r}", location=f"{cfg_file} key speculators_config.verifier.name_or_path", expected=repo,
                found=named, hint="a drafter only drafts well for the target it was trained on; vLLM serves the "
                                  "verifier named here when given this drafter folder alone")
    usual = t.default_target_layer_ids
    if usual and len(usual) == len(ids) and list(ids) != list(usual):
        for shift in (1, -1):
            if [i + shift for i in ids] == list(usual):
                out.add("DSH309", f"target layer ids {ids} are {t.source}'s usual drafter ids {list(usual)} shifted "
                        f"by {-shift:+d}: hidden-state indices read as layer indices (or the reverse)?",
                        location=f"{cfg_file} key target_layer_ids", expected=list(usual), found=ids,
                        hint="layer index i = HF output_hidden_states[i + 1]; speculators / DeepSeek-V4 ids are "
                             "hidden-state indices")
    for own, ref, label in (("embed_tokens.weight", t.embed, "embedding"), ("lm_head.weight", t.lm_head, "LM head")):
        if ref is None:
            out.add("DSH307", f"the target's {label} tensor was not found in its headers; copies not compared",
                    location=t.source)
            continue
        mine = spec.tensors.get(own)
        if mine is None or (own == "lm_head.weight" and spec.draft_vocab_size != spec.vocab_size):
            continue
        if mine.shape != ref.shape or mine.dtype != ref.dtype:
            out.add("DSH305", f"the drafter's {own} is {mine.dtype} {list(mine.shape)}, the target's {ref.name} is "
                    f"{ref.dtype} {list(ref.shape)}", location=f"tensor {own}",
                    expected=f"{ref.dtype} {list(ref.shape)}", found=f"{mine.dtype} {list(mine.shape)}")
    return final


def check_family(d: OpenedDraft, t: TargetSpec, out: Collector) -> None:
    """A DSpark drafter serves targets of its own backbone family only: vLLM 0.32 has one DSpark class per family
    (qwen3_dspark.py, gemma4_dspark.py, deepseek_v4/*/dspark.py, K3DSparkConfig) and DeepSpec one trainer per target
    family (deepspec/trainer/dspark_trainer.py Qwen3DSparkTrainer / Gemma4DSparkTrainer). DFlash / EAGLE-3 drafters
    are exempt: z-lab ships Qwen3-backbone DFlash drafters for Llama and gpt-oss targets."""
    spec = d.spec
    if spec.variant != "dspark" and not d.recipe.typed.family_bound:
        return
    theirs = family_of_target(t.model_type)
    if theirs is None or theirs == spec.family:
        return
    out.add("DSH311", f"the drafter is a {spec.family} {spec.variant} drafter ({spec.architecture or spec.layout}) "
            f"but the target {t.source} is {t.model_type!r}, a {theirs} model", location=str(
                Path(d.checkpoint.path) / "config.json") + " key architectures",
            expected=theirs, found=spec.family,
            hint=f"a DSpark drafter is trained for one target family and vLLM 0.32 serves a {theirs} target's DSpark "
                 f"drafter with its own class (converters/families/{theirs}.yaml target_model_types); is "
                 f"{t.source} the target this drafter was trained on?")


