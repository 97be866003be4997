"""Rank code for test_parity (4 ranks): the three megarl.models.verify runs of the test, one after the
other in the same processes (a launch costs more than a run in it). argv: a JSON object {part: verify's
argv} with the parts "lm" and "lm-<family>" (run with Megatron's linear layers through OpenBLAS,
MEGARL_CPU_GEMM=openblas), "scalar-<family>", "rope", "moe" (the default choice, as a user's run makes
it) and "lora-<family>" (megarl.models.lora.verify: LoRA vs PEFT). Every result row gets its part's name
under "part".
"""

from __future__ import annotations

import json
import os

from megarl.models import verify
from megarl.models.lora import verify as lora_verify


def main(argv: list[str]) -> list[dict]:
    (parts,) = argv
    results = []
    for part, args in json.loads(parts).items():
        before = os.environ.get("MEGARL_CPU_GEMM")
        if part == "lm" or part.startswith("lm-"):
            os.environ["MEGARL_CPU_GEMM"] = "openblas"
        try:
            program = lora_verify if part.startswith("lora") else verify
            results += [{**row, "part": part} for row in program.main(args)]
        finally:
            if before is None:
                os.environ.pop("MEGARL_CPU_GEMM", None)
            else:
                os.environ["MEGARL_CPU_GEMM"] = before
    return results
