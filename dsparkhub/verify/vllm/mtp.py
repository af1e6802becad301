"""The target's own MTP layers as a vLLM speculative configuration (``dsparkhub verify --baseline mtp:N``).

vLLM drafts with a target's MTP layers under the method ``mtp`` with no drafter model: it loads the target's config,
rewrites it into its MTP drafter's (``SpeculativeConfig.hf_config_override``: model_type ``mimo_mtp``,
``deepseek_mtp``... and ``n_predict``, the MTP layer count) and refuses a drafter model_type outside its
``MTPModelTypes`` registry, and an n above ``n_predict`` that is not a multiple of it. Every name of that is a fact
of the version contract (``contract.yaml`` ``mtp``), not code here.

- :func:`mtp_facts` runs in the vLLM child (it imports vLLM through the contract's names) and answers what the
  installed vLLM makes of the target, before any engine starts;
- :func:`mtp_refusal` (parent, no vLLM import) turns those facts into the one-paragraph refusal, or None.
"""

from __future__ import annotations

import copy
from typing import get_args

from dsparkhub.verify.vllm.contract import VllmContract, resolve


def mtp_facts(model: str, contract: VllmContract) -> dict:
    """What the installed vLLM makes of ``model``'s MTP layers, read with the contract's ``mtp`` names (child only).

    Returns:
        ``{"missing": [names the installed vLLM lacks]}``, else ``{"model_type", "architecture"}`` of the target,
        ``{"mtp_model_type", "mtp_architecture", "layers"}`` of the config vLLM's override makes of it (``layers``:
        its ``layers_key``, None when unset), ``registered`` (that model_type is in vLLM's MTP registry),
        ``class_registered`` (that architecture is in vLLM's model registry), ``registry_size`` and
        ``override_error`` (the override's own ValueError, e.g. a checkpoint without MTP weights; None).
    """
    fact = contract.value("mtp")
    names = {key: fact[key] for key in ("config", "override", "registry", "classes")}
    found, missing = {}, []
    for key, name in names.items():
        try:
            found[key] = resolve(name)
        except LookupError:
            missing.append(name)
    if missing:
        return {"missing": missing}
    config = found["config"](model, trust_remote_code=False)
    out = {"model_type": getattr(config, "model_type", None),
           "architecture": (getattr(config, "architectures", None) or [None])[0], "override_error": None}
    try:
        drafted = found["override"](copy.deepcopy(config))
    except ValueError as exc:  # vLLM's own refusal of this target's MTP layers
        return {**out, "override_error": str(exc)}
    registry = get_args(found["registry"])
    arch = (getattr(drafted, "architectures", None) or [None])[0]
    return {**out, "mtp_model_type": drafted.model_type, "mtp_architecture": arch,
            "layers": getattr(drafted, fact["layers_key"], None), "registered": drafted.model_type in registry,
            "registry_size": len(registry),
            "class_registered": arch in set(found["classes"].get_supported_archs())}


def mtp_refusal(facts: dict, n: int, *, target: str, contract: VllmContract) -> str | None:
    """The one paragraph (what, why with vLLM's file:line, what to do) refusing ``--baseline mtp:n`` on ``target``
    from :func:`mtp_facts`' answer, or None when vLLM can draft with the target's MTP layers at ``n``.

    Refused: the installed vLLM lacks a name of the contract; vLLM's override raises; the target's model_type gets
    no MTP drafter in vLLM's registry (or its class is not in the model registry); the drafter config holds no MTP
    layers; ``n`` above the layer count and not a multiple of it (``above_layers: divisible``).
    """
    fact, version = contract.value("mtp"), contract.version
    todo = "--baseline none, or a drafter baseline with --backend reference"
    what = f"--baseline mtp:{n} on vLLM {version} (target {target}"
    if facts.get("model_type"):
        what += f", model_type {facts['model_type']}, architecture {facts['architecture']}"
    what += ")"
    if facts.get("missing"):
        why = f"this vLLM lacks {', '.join(facts['missing'])}, which the contract's `mtp` fact names"
    elif facts.get("override_error"):
        why = f"vLLM refuses the target's MTP layers: {facts['override_error']}"
    elif not facts.get("registered"):
        why = (f"vLLM's {fact['override']} makes model_type {facts['mtp_model_type']} of this config, which is not "
               f"one of the {facts['registry_size']} model_types of its MTP registry {fact['registry']}, so vLLM "
               "has no MTP drafter for this target")
    elif not facts.get("class_registered"):
        why = (f"the MTP drafter class {facts['mtp_architecture']} is not in vLLM's model registry "
               f"{fact['classes']}")
    elif not facts.get("layers"):
        why = (f"the MTP drafter config vLLM makes of this target has {fact['layers_key']}="
               f"{facts.get('layers')}: the target carries no MTP layers")
    elif n > facts["layers"] and fact.get("above_layers") == "divisible" and n % facts["layers"]:
        why = (f"the target has {facts['layers']} MTP layer(s) ({fact['layers_key']}); vLLM reuses them for more "
               f"draft tokens only when num_speculative_tokens is a multiple of that, and {n} is not")
        todo = f"--baseline mtp:{facts['layers']} (or a multiple of {facts['layers']})"
    else:
        return None
    return f"{what} cannot be measured: {why} ({contract.source('mtp')}). Nothing was loaded. What to do: {todo}."
