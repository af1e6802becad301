"""Checkpoint files on disk: header-only reading (:mod:`.checkpoint`), streamed atomic writing (:mod:`.writer`), hashing (:mod:`.hashing`)."""
