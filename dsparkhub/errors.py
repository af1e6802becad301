"""The project's error types.

One root, :class:`DsparkhubError`; each subclass also subclasses the stdlib error it is (``ValueError``,
``FileNotFoundError``, ...) and carries the attributes the CLI needs to print one clear paragraph (the file, the
tensor or key, what was expected, what was found, and a hint). Library code raises these and never prints; the CLI
maps them to exit code 1 (see ``dsparkhub.cli``).

This module deliberately holds no logic beyond formatting the message.
"""

from __future__ import annotations

from pathlib import Path


class DsparkhubError(Exception):
    """Root of every error dsparkhub raises on purpose.

    Args:
        message: what went wrong, naming the object (file, tensor, key).
        path: the file or folder involved, if any.
        hint: how to fix it, one sentence.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, hint: str | None = None):
        self.message = message
        self.path = str(path) if path is not None else None
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = self.message
        if self.path and self.path not in text:
            text = f"{self.path}: {text}"
        if self.hint:
            text = f"{text}\nHint: {self.hint}"
        return text


class CheckpointFormatError(DsparkhubError, ValueError):
    """A safetensors file, index or config is malformed (truncated, invalid JSON, bad offsets, unknown dtype)."""


class CheckpointNotFoundError(DsparkhubError, FileNotFoundError):
    """A checkpoint folder, file, shard named by an index, or ``step_latest`` target does not exist."""


class LayoutError(DsparkhubError, ValueError):
    """The checkpoint matches no known layout, or matches a layout but breaks its rules."""


class IncompatibleTargetError(DsparkhubError, ValueError):
    """The drafter was built for another target (hidden size, vocab, layer count, fc width, ...)."""


class ConversionRefusedError(DsparkhubError, ValueError):
    """A requested conversion would change the drafter's behaviour (anchor-first written as 1+N, unmappable vocab)."""


class OutputExistsError(DsparkhubError, FileExistsError):
    """The output folder exists and ``--overwrite`` was not given, or another run is writing it."""


class UnsafeCheckpointError(DsparkhubError, PermissionError):
    """The checkpoint asks for something unsafe: pickle weights, paths escaping the checkpoint folder."""


class ValidationFailedError(DsparkhubError, ValueError):
    """``validate`` found errors; ``report`` holds every finding."""

    def __init__(self, message: str, *, report=None, **kwargs):
        self.report = report
        super().__init__(message, **kwargs)


class VerifyError(DsparkhubError, RuntimeError):
    """A verify run could not produce numbers (engine refused, crashed, or ran out of memory)."""


class LosslessMismatchError(VerifyError):
    """Greedy outputs with and without the drafter differ: the speculative path is not lossless.

    Args:
        prompt_index: index of the prompt in its dataset.
        position: index of the first differing output token.
        expected: token id produced without the drafter.
        found: token id produced with the drafter.
    """

    def __init__(self, message: str, *, dataset: str, prompt_index: int, position: int, expected: int, found: int,
                 **kwargs):
        self.dataset, self.prompt_index, self.position = dataset, prompt_index, position
        self.expected, self.found = expected, found
        super().__init__(message, **kwargs)


class EngineUnavailableError(VerifyError):
    """The requested engine (vLLM) is not installed or refuses this drafter on this machine."""


class ResultsError(DsparkhubError, ValueError):
    """A results file is malformed, of an unknown schema version, or belongs to another drafter."""


class HubError(DsparkhubError, RuntimeError):
    """A push or a remote read failed; the remote is left as it was before the commit."""


class ManifestError(DsparkhubError, LookupError):
    """A manifest is unknown or does not match the manifest schema."""


class OutputNotWritableError(DsparkhubError, PermissionError):
    """An output path cannot be written (read-only folder, no permission), found before any work starts."""


class CardError(DsparkhubError, ValueError):
    """The card cannot be rendered (bad template, missing drafter config, nothing to report)."""
