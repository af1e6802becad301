"""The reference PyTorch engine: the drafter as a torch module (:mod:`.modeling`), batch-1 (:mod:`.engine`) and
batched (:mod:`.batching`) speculative decoding."""
