"""Prompt files and datasets: what ``verify``, ``calibrate`` and ``convert --draft-vocab-from`` measure or count on.

:mod:`~dsparkhub.prompts.datasets` (dataset specs, JSONL formats, the built-in set, tokenizing),
:mod:`~dsparkhub.prompts.files` (the shared record and error, Hub dataset files through
:mod:`dsparkhub.io.hub_datasets`), :mod:`~dsparkhub.prompts.speed_bench` (SPEED-Bench records). Below ``convert`` and
``verify`` in the flow; it imports neither.
"""
