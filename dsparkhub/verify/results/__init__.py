"""The results file of one ``dsparkhub verify`` run (schema ``dsparkhub.verify.results/2``, reads ``/1``).

Modules: ``schema`` (the pydantic dataclasses, every key documented, atomic save), ``derive`` (RunStats into the
published numbers: τ, acceptance, speedups, reliability, summary means, best n), ``reading`` (strict reading, the /1
upgrade, key-path error messages), ``table`` (terminal tables), ``identity`` (target fingerprint).
"""
