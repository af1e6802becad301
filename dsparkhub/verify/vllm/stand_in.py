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
    CUDA device is visible), its flag treated as true inside ``with`` (with the names its module binds when the flag is
    true, ``flag_binds``, bound to the installed package) and restored after, so the engine stage meets vLLM's real
    refusal. ``used`` says what was swapped (None: nothing)."""

    def __init__(self, contract: VllmContract):
        import os

        import torch

        self.spec = contract.value("cpu_stand_in") if not torch.cuda.is_available() else None
        self.used: str | None = None
        self._saved: Any = None
        self._bound: dict[str, Any] = {}
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
                self._bound = {attr: getattr(module, attr) for attr in self.spec.get("flag_binds", {})}
                for attr, target in self.spec.get("flag_binds", {}).items():
                    setattr(module, attr, _resolve(target))
                env = ", ".join(f"{k}={v}" for k, v in self.spec.get("env", {}).items())
                binds = ", ".join(self._bound)
                self.used = (f"{self.spec['flag']} treated as true" + (f" (with {binds} bound to the installed "
                                                                       f"package)" if binds else "")
                             + f" and {env} for the config and load_weights stages only ({self.spec.get('why')}); "
                             f"nothing is compiled or run on Triton")
                if self._stubbed:
                    self.used += (f"; placeholders for {', '.join(self._stubbed)} (its "
                                  f"package {self.spec['import_stubs']['needs']} is not installed; nothing of it runs)")
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            module, name, value = self._saved
            setattr(module, name, value)
            for attr, bound in self._bound.items():
                setattr(module, attr, bound)


def _resolve(target: str) -> Any:
    """The object a ``flag_binds`` target names: ``package.module`` or ``package.module:attribute``."""
    import importlib

    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


#: run at interpreter start (a ``sitecustomize`` first on PYTHONPATH) and here: placeholders for the stubbed modules
_STUB_FINDER = """
import importlib.abc, importlib.machinery, sys

class _Placeholder:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("dsparkhub vllm-check stand-in: a placeholder of a module whose package is not installed")

class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, modules):
        self.modules = modules
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in self.modules else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        for attr in self.modules[module.__name__]:
            setattr(module, attr, type(attr, (_Placeholder,), {}))

sys.meta_path.insert(0, _StubFinder(MODULES))
"""


def _stub_imports(stubs: dict) -> list[str]:
    """Where the package ``stubs["needs"]`` is absent, make each of ``stubs["modules"]`` (``{module: [names]}``)
    import as placeholders of those names (classes that refuse to be instantiated), in this interpreter and in child
    interpreters (a ``sitecustomize`` first on ``PYTHONPATH``: vLLM's registry inspects a class in a subprocess).
    Returns the modules stubbed (none where the package is installed)."""
    import importlib.util
    import os
    import tempfile
    from pathlib import Path

    modules = stubs.get("modules") or {}
    if not modules or importlib.util.find_spec(stubs.get("needs") or "") is not None:
        return []
    root = Path(tempfile.mkdtemp(prefix="dsparkhub-stubs-"))
    site = root / "sitecustomize.py"
    site.write_text("# dsparkhub vllm-check stand-in (verify/vllm/stand_in.py)\n"
                    + _STUB_FINDER.replace("MODULES", repr(modules)))
    spec = importlib.util.spec_from_file_location("dsparkhub_import_stubs", site)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # the same finder in this interpreter
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return sorted(modules)
