"""Rank code for test_parity (4 ranks): the three megarl.models.verify runs of the test, one after the
other in the same processes (a launch costs more than a run in it). argv: a JSON object {part: verify's argv} with the parts "lm" (run
with Megatron's linear layers through OpenBLAS, MEGARL_CPU_GEMM=openblas), "scalar" and "rope" (the
default choice, as a user's run makes it). Every result row gets its part's name under "part".
"""

from __future__ import annotations

import json
import os

from megarl.models import verify


def main(argv: list[str]) -> list[dict]:
    (parts,) = argv
    results = []
    for part, args in json.loads(parts).items():
        before = os.environ.get("MEGARL_CPU_GEMM")
        if part == "lm":
            os.environ["MEGARL_CPU_GEMM"] = "openblas"
        try:
            results += [{**row, "part": part} for row in verify.main(args)]
        finally:
            if before is None:
                os.environ.pop("MEGARL_CPU_GEMM", None)
            else:
                os.environ["MEGARL_CPU_GEMM"] = before
    return results
