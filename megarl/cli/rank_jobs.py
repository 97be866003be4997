"""Rank programs the CLI starts under torchrun (conversion, verification): the layout is checked
against the model first, so an impossible one is refused before any rank starts."""

from __future__ import annotations

from pathlib import Path

from megarl.cli.errors import UsageError


def check_launch(
    hf: str, tp: int, pp: int, vpp: int | None, nproc: int, sequence_parallel: bool = False, ep: int = 1
) -> None:
    """Reject impossible conversions/verifications before torchrun starts any rank."""
    from megarl.config.errors import ConfigError
    from megarl.config.parallel_checks import check_layout_vs_model, read_model_dims
    from megarl.config.schema import ParallelConfig
    from megarl.distributed.layout import LayoutKeys, ParallelLayout
    from megarl.models.from_hf import ModelArchitecture

    if not (Path(hf) / "config.json").is_file():
        raise UsageError(f"--hf {hf}: no config.json there; point it at a Hugging Face checkpoint directory")
    parallel = ParallelConfig(tp=tp, pp=pp, ep=ep, vpp=vpp, sequence_parallel=sequence_parallel)
    flags = LayoutKeys(flags=True)  # problem lines name --tp, --pp, ... as typed
    problems = ParallelLayout.check(parallel, nproc, flags, world=f"--nproc={nproc}")
    ModelArchitecture.from_pretrained(hf)  # names an unsupported architecture before anything else
    try:
        dims = read_model_dims(hf)
    except (KeyError, ValueError, TypeError) as e:
        raise UsageError(f"--hf {hf}: config.json is malformed ({type(e).__name__}: {e})") from None
    check_layout_vs_model(flags, parallel, dims, problems)
    if problems:
        raise UsageError(str(ConfigError(problems)).replace("invalid megarl config", "invalid layout"))


def launch(program: str, argv: list[str], nproc: int) -> dict:
    """Run the rank program `program` on `nproc` ranks; its exit code and each rank's result."""
    from megarl.distributed.rank_program import launch_rank_program

    result = launch_rank_program(program, argv, nproc)
    if result.returncode != 0 and not result.results:
        raise UsageError(f"{program} failed on {nproc} rank(s):\n{result.failure_summary()}")
    return {"returncode": result.returncode, "results": result.results}
