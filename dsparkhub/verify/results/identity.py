"""The identity of a local target recorded in a results file (``target.fingerprint``): re-exports
:func:`dsparkhub.io.hashing.target_fingerprint`, which moved to ``io`` so ``convert`` records it without importing
``verify``."""

from dsparkhub.io.hashing import target_fingerprint

__all__ = ["target_fingerprint"]
