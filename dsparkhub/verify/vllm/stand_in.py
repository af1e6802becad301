"""The named stand-in that lets ``vllm-check`` run a vLLM version's config and load_weights stages on a machine
where that version refuses to start (vLLM 0.34 on an x86 CPU without triton-cpu, which is not on the package index):
what is swapped is the contract's ``cpu_stand_in`` fact (:mod:`dsparkhub.verify.vllm.contract`), and the report says
so. Imported by the vLLM check child only.
"""

from __future__ import annotations

from typing import Any

from dsparkhub.verify.vllm.contract import VllmContract


class CpuStandIn:
    """The contract's ``cpu_stand_in`` for vLLM versions that cannot run the config / load_weights stages on this
    machine (0.34 on an x86 CPU without triton-cpu): its env is set at construction (before vLLM loads, where no
    CUDA device is visible), its flag treated as true inside ``with`` and restored after, so the engine stage meets
    vLLM's real refusal. ``used`` says what was swapped (None: nothing)."""

    def __init__(self, contract: VllmContract):
        import os

        import torch

        self.spec = contract.value("cpu_stand_in") if not torch.cuda.is_available() else None
        self.used: str | None = None
        self._saved: Any = None
        self._stubbed = _stub_imports((self.spec or {}).get("import_stubs") or {})
        if self.spec:
            for key, value in self.spec.get("env", {}).items():
                os.environ.setdefault(key, str(value))

    def __enter__(self) -> "CpuStandIn":
        if self.spec and self.spec.get("flag"):
            import importlib

            module_name, _, name = self.spec["flag"].partition(":")
            module = importlib.import_module(module_name)
            self._saved = (module, name, getattr(module, name))
            if not self._saved[2]:
                setattr(module, name, True)
                env = ", ".join(f"{k}={v}" for k, v in self.spec.get("env", {}).items())
                self.used = (f"{self.spec['flag']} treated as true and {env} for the config and load_weights stages "
                             f"only ({self.spec.get('why')}); nothing is compiled or run on Triton")
                if self._stubbed:
                    self.used += (f"; import stubs for absent modules {', '.join(self._stubbed)} (names only, "
                                  "nothing of them runs)")
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            module, name, value = self._saved
            setattr(module, name, value)


def _stub_imports(stubs: dict) -> list[str]:
    """Make each absent module of ``stubs`` (``{"pkg.mod": {EnumName: [MEMBER, ...]}}``) importable as a stub that
    holds those enums (values: the lower-cased member names), here and in child interpreters (a temp folder first on
    ``sys.path`` and ``PYTHONPATH``). Returns the modules stubbed (none where the real one is installed)."""
    import importlib.util
    import os
    import sys
    import tempfile
    from pathlib import Path

    made = []
    root: Path | None = None
    for module, enums in stubs.items():
        top = module.split(".")[0]
        if importlib.util.find_spec(top) is not None:
            continue
        root = root or Path(tempfile.mkdtemp(prefix="dsparkhub-stubs-"))
        folder = root.joinpath(*module.split(".")[:-1])
        folder.mkdir(parents=True, exist_ok=True)
        for parent in [root.joinpath(*module.split(".")[:i]) for i in range(1, len(module.split(".")))]:
            (parent / "__init__.py").touch()
        body = ["# dsparkhub vllm-check import stub (verify/vllm/stand_in.py): names only", "import enum", ""]
        body += [f"{name} = enum.Enum({name!r}, {[(m, m.lower()) for m in members]!r})" for name, members in enums.items()]
        (folder / f"{module.split('.')[-1]}.py").write_text("\n".join(body) + "\n")
        made.append(module)
    if root is not None:
        sys.path.insert(0, str(root))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return made
