"""Model families as data: one module per family builds a frozen :class:`FamilySpec`.

Adding a family = a new module here and one entry in ``FAMILIES`` (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from .bailing_moe_v3 import BAILING_MOE_V3
from .deepseek_v3 import DEEPSEEK_V3
from .deepseek_v32 import DEEPSEEK_V32
from .deepseek_v4 import DEEPSEEK_V4
from .deepseek_v4_dspark import DEEPSEEK_V4_DSPARK
from .glm4_moe import GLM4_MOE
from .glm4_moe_lite import GLM4_MOE_LITE
from .glm_moe_dsa import GLM_MOE_DSA
from .hy_v3 import HY_V3
from .mimo_v2_flash import MIMO_V2, MIMO_V2_FLASH
from .nemotron_h import NEMOTRON_H
from .qwen3_5 import QWEN3_5, QWEN3_5_MOE
from .qwen3_next import QWEN3_NEXT
from .qwen4_exp import QWEN4_EXP
from .spec import FamilySpec, Role, Row
from .step3p5 import STEP3P5

#: every family mtpforge handles, by name (the ``family`` of inspect's JSON)
FAMILIES: dict[str, FamilySpec] = {s.name: s for s in (QWEN3_5, QWEN3_5_MOE, QWEN3_NEXT, GLM4_MOE, GLM4_MOE_LITE, NEMOTRON_H, STEP3P5,
                                                  DEEPSEEK_V3, DEEPSEEK_V32, GLM_MOE_DSA, HY_V3,
                                                  MIMO_V2_FLASH, MIMO_V2, QWEN4_EXP, DEEPSEEK_V4,
                                                  DEEPSEEK_V4_DSPARK, BAILING_MOE_V3)}

__all__ = ["FAMILIES", "FamilySpec", "Role", "Row"]
