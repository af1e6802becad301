"""Test helpers that ship with dsparkhub: a local Hub server (:mod:`dsparkhub.testing.hub_server`).

Nothing here is imported by the library itself; tests and users who want to try ``dsparkhub push`` without the real
Hugging Face Hub import it explicitly.
"""

from dsparkhub.testing.hub_server.hub import LocalHub
from dsparkhub.testing.hub_server.store import Fault, HubRequest

__all__ = ["Fault", "HubRequest", "LocalHub"]
