"""SGLang 0.5.23: the server backend (:mod:`.backend`), SGLang's own checks (:mod:`.checks`) and the script they run
in ``.venv-sglang`` (:mod:`.child`)."""
