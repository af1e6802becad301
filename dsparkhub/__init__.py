"""dsparkhub: the last mile for DSpark speculative-decoding drafters.

Convert a trained drafter from any known layout into a checkpoint vLLM loads, validate it against its target from
safetensors headers alone, verify it (lossless check, acceptance length τ, speedup), write a model card with the
measured numbers and push it to the Hugging Face Hub.
"""

__version__ = "0.1.0"
