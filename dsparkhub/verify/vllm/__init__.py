"""vLLM 0.32 as a verify backend and as a checker: offline / server backend (:mod:`.backend`), vLLM's own checks
(:mod:`.checks`), and the child process that imports vLLM (:mod:`.child`)."""
