"""The draft/verify smoke test: backends (reference PyTorch engine, vLLM), prompts, the results schema."""
