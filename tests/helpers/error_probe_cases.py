"""The error probe's cases: config, layout and model (error_probe_config), data and reward files
(error_probe_data), checkpoints, conversion, disk and signals (here); those that need a launch
(REFERENCED) and issue 39's (error_probe_issue39). `ALL_CASES` is every one, `CASES` the probe's own."""

from __future__ import annotations

import json
import os

from tests.helpers.error_probe import (
    Case,
    Workspace,
    convert_case,
    reward_file_case,
    trainer_state_case,
)
from tests.helpers.error_probe_config import CONFIG_CASES
from tests.helpers.error_probe_data import DATA_CASES
from tests.helpers.error_probe_issue39 import ISSUE_CASES, UNIT_TESTS


def _corrupt_shard(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    shard = next((run / "checkpoints" / "step_2" / "actor" / "model").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return convert_case(ws, run)


def _no_manifest(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    (run / "checkpoints" / "step_2" / "actor" / "manifest.json").unlink()
    return convert_case(ws, run)


def _pickle_metadata(ws: Workspace) -> list[str]:
    """DCP's `.metadata` replaced by a pickle whose loading would run `os.system` (and rehashed into the
    manifest, so only the unpickler stands in the way)."""
    import pickle

    from megarl.checkpoint.manifest import write_manifest

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {ws.case_dir / 'PWNED'}",))

    run = ws.checkpoint_run()
    actor = run / "checkpoints" / "step_2" / "actor"
    (actor / "model" / ".metadata").write_bytes(pickle.dumps(Payload()))
    write_manifest(actor)
    return convert_case(ws, run)


def _latest_missing(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    (run / "checkpoints" / "latest").write_text("step_9\n")
    return ws.train(f"trainer.output_dir={run}")


def _rl_state(ws: Workspace, **fields: object) -> list[str]:
    state = {"version": 1, "step": 2, "job": "sft", "data": {"epoch": 0, "position": 32}, **fields}
    return trainer_state_case(ws, json.dumps(state))


def _read_only_output(ws: Workspace) -> list[str]:
    return ws.train(f"trainer.output_dir={ws.read_only_dir() / 'run'}")


def _sigint_reward(ws: Workspace) -> list[str]:
    """Ctrl-C while `megarl train` loads its inputs: a real SIGINT to this process, sent by the reward file
    as it is imported in the process that checks it (whose parent is `megarl train`)."""
    text = "import os, signal, time\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(5)\n"
    return reward_file_case(ws, text)


CASES: list[Case] = [
    *CONFIG_CASES,
    *DATA_CASES,
    # --- checkpoints, resume and conversion ---
    Case(
        "K01",
        "checkpoint",
        "a checkpoint shard with one flipped byte (checksum mismatch)",
        _corrupt_shard,
        (
            "is incomplete or damaged",
            "__0_0.distcp is corrupt: CRC-32",
            "(same size)",
            "export an earlier checkpoint",
        ),
        2,
    ),
    Case(
        "K02",
        "checkpoint",
        "a checkpoint without manifest.json (as `convert hf-to-mcore` writes): accepted, its shards checked by their records",
        _no_manifest,
        ('"out": "<case>/hf"',),
        0,
    ),
    Case(
        "K03",
        "security",
        "a pickle payload (`os.system`) as DCP's `.metadata`, checksums rehashed",
        _pickle_metadata,
        ("refusing to load posix.system from checkpoint metadata",),
        2,
    ),
    Case(
        "K05",
        "resume",
        "`trainer.resume` naming a missing path",
        lambda ws: ws.train(f"trainer.resume={ws.case_dir / 'run' / 'checkpoints' / 'step_8'}"),
        (
            "trainer.resume=<case>/run/checkpoints/step_8 is neither auto, disable nor an existing checkpoint directory",
        ),
        2,
    ),
    Case(
        "K06",
        "resume",
        "`trainer.resume` naming a directory that is no checkpoint",
        lambda ws: ws.train(f"trainer.resume={ws.data}"),
        ("<tmp>/data is not a megarl checkpoint (no megarl_checkpoint.json)",),
        2,
    ),
    Case(
        "K07",
        "resume",
        "`latest` naming a step that is gone",
        _latest_missing,
        ("latest names step_9, which does not exist; the run has complete: step_2",),
        2,
    ),
    Case(
        "K08",
        "resume",
        "trainer_state.json that is not JSON",
        lambda ws: trainer_state_case(ws, "{step: 2"),
        ("trainer_state.json cannot be read (JSONDecodeError", "resume from an earlier step directory"),
        2,
    ),
    Case(
        "K09",
        "resume",
        "an SFT run's checkpoint resumed by `megarl train`",
        _rl_state,
        ("was saved by megarl sft, but this run is megarl train (RL)",),
        2,
    ),
    Case(
        "K10",
        "conversion",
        "`convert mcore-to-hf --ckpt` mistyped (fixed: said only 'does not exist')",
        lambda ws: convert_case(ws, ws.checkpoint_run() / "chekpoints"),
        (
            "<case>/run/chekpoints does not exist (<case>/run holds: checkpoints, metrics.jsonl); name a run directory",
        ),
        2,
    ),
    Case(
        "K11",
        "conversion",
        "`convert mcore-to-hf --ckpt` an HF model dir",
        lambda ws: convert_case(ws, ws.model),
        ("<tmp>/model is not a megarl checkpoint (no megarl_checkpoint.json)", "megarl convert hf-to-mcore"),
        2,
    ),
    Case(
        "K12",
        "conversion",
        "`convert mcore-to-hf --role critic` of a run without a critic",
        lambda ws: convert_case(ws, ws.checkpoint_run(), "--role", "critic"),
        ("step_2 has no role 'critic' (it has: actor); pick one with --role",),
        2,
    ),
    Case(
        "K13",
        "conversion",
        "`convert hf-to-mcore --hf` mistyped",
        lambda ws: [
            "convert",
            "hf-to-mcore",
            "--hf",
            str(ws.case_dir / "llama"),
            "--out",
            str(ws.case_dir / "mc"),
        ],
        ("--hf <case>/llama: no config.json there",),
        2,
    ),
    Case(
        "K14",
        "conversion",
        "`convert hf-to-mcore` with TP not dividing the heads",
        lambda ws: [
            "convert",
            "hf-to-mcore",
            "--hf",
            str(ws.model),
            "--out",
            str(ws.case_dir / "mc"),
            "--tp",
            "3",
        ],
        ("--tp=3 does not divide num_attention_heads=4",),
        2,
    ),
    Case(
        "K15",
        "conversion",
        "`convert` without `--out`",
        lambda ws: ["convert", "mcore-to-hf", "--ckpt", str(ws.case_dir)],
        ("the following arguments are required: --out",),
        2,
    ),
    # --- outputs, disk, signals ---
    Case(
        "O01",
        "disk",
        "trainer.output_dir on a read-only file system",
        _read_only_output,
        ("trainer.output_dir=<case>/ro/run cannot be written", "choose a location you can write to"),
        2,
    ),
    Case(
        "O02",
        "disk",
        "trainer.output_dir that is a file (fixed: was 'writing X failed (FileExistsError…)', exit 1)",
        lambda ws: ws.train(f"trainer.output_dir={ws.file('out', 'x')}"),
        ("trainer.output_dir=<case>/out cannot be created: <case>/out is a file, not a directory",),
        2,
    ),
    Case(
        "O03",
        "disk",
        "trainer.output_dir under a file (fixed as O02)",
        lambda ws: ws.train(f"trainer.output_dir={ws.file('out', 'x') / 'run'}"),
        ("trainer.output_dir=<case>/out/run cannot be created: <case>/out is a file, not a directory",),
        2,
    ),
    Case(
        "S01",
        "signals",
        "Ctrl-C (a real SIGINT) while `megarl train` loads",
        _sigint_reward,
        ("megarl train: interrupted while checking its inputs; nothing was started",),
        130,
    ),
]


# cases that need a launch or a loader below the command line: the test that shows them
REFERENCED: list[Case] = [
    Case(
        "K04",
        "security",
        "a pickle payload in `common.pt` / a ShardedObject `.pt` (resume on the ranks)",
        None,
        (),
        1,
        UNIT_TESTS + "checkpoint/test_role.py::test_no_code_unpickling_forces_weights_only_torch_load",
        "torch.load inside no_code_unpickling() is forced to weights_only: `UnpicklingError: Weights only load failed …` (torch's message; the ranks' wording under `megarl train` is not asserted)",
    ),
    Case(
        "S02",
        "signals",
        "Ctrl-C while the reward workers are inside a call",
        None,
        (),
        130,
        "tests/unit/test_probe.py::test_ctrl_c_while_rewards_are_scored_kills_every_reward_worker_at_once",
        "KeyboardInterrupt reaches the driver within 5 s, every reward worker killed; the job runner then "
        "prints `megarl: interrupted; every worker was stopped` (exit 130, as S01). No test sends Ctrl-C to "
        "a multi-process run",
    ),
]

ALL_CASES: list[Case] = CASES + REFERENCED + ISSUE_CASES
