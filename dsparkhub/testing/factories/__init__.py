"""Tiny checkpoints with the layouts' *real* tensor names and config keys, for tests and benchmarks.

Every factory writes random weights (seeded) at toy sizes into a folder and returns its path; drafter factories take
the target folder and copy its frozen tensors byte for byte. One module per layout family, all importable from here
(``from dsparkhub.testing.factories import make_qwen3_target``, or ``factories.make_v4_target``):

- :mod:`~dsparkhub.testing.factories.qwen3`: the Qwen3 target, DeepSpec and z-lab DFlash / DFlash2 drafters;
- :mod:`~dsparkhub.testing.factories.speculators`: speculators DSpark / DFlash and EAGLE-3 drafters;
- :mod:`~dsparkhub.testing.factories.families`: Gemma4 (target + DeepSpec drafter), Kimi K3 MLA, DeepSeek-V4;
- :mod:`~dsparkhub.testing.factories.common`: what they share (folder writing, random values, the dense MLP).

Nothing here reads a layout or converts: that is what the tests test with these folders.
"""

from dsparkhub.testing.factories.common import QWEN3_NORMS, dense_mlp, random_tensors, write_checkpoint
from dsparkhub.testing.factories.families import (GEMMA4_NORMS, make_deepspec_gemma4_drafter, make_gemma4_target,
                                                  make_k3_dspark_drafter, make_v4_target, v4_stage_tensors)
from dsparkhub.testing.factories.qwen3 import (make_deepspec_drafter, make_qwen3_target, make_zlab_dflash2_drafter,
                                               make_zlab_dflash_drafter, qwen3_drafter_tensors)
from dsparkhub.testing.factories.speculators import draft_vocab_table, make_eagle3_drafter, make_speculators_drafter

__all__ = ["GEMMA4_NORMS", "QWEN3_NORMS", "dense_mlp", "draft_vocab_table", "make_deepspec_drafter",
           "make_deepspec_gemma4_drafter", "make_eagle3_drafter", "make_gemma4_target", "make_k3_dspark_drafter",
           "make_qwen3_target", "make_speculators_drafter", "make_v4_target", "make_zlab_dflash2_drafter",
           "make_zlab_dflash_drafter", "qwen3_drafter_tensors", "random_tensors", "v4_stage_tensors",
           "write_checkpoint"]
