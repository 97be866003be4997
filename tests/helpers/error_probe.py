"""The error probe: what a new user and an adversary feed megarl, and the one line it answers with.

Each `Case` writes its inputs into a `Workspace` (a tiny Llama, the digits task's data) and returns the
`megarl` command line that meets them; `run_case` runs it in this process through `megarl.cli.main`, the
code path of the `megarl` command, and returns the exit code and the message. No case starts a worker:
the data, reward and checkpoint cases fail while `megarl train` loads its inputs, before the workers
start, and RAY_ADDRESS names no cluster (`probe-guard`), so a case that wrongly passes ends at once at
the cluster check instead of training. Cases that need a launch (signals, concurrent runs) or a fault
injected mid-run name the test that shows them and quote its message.

The cases: tests/helpers/error_probe_cases.py (ALL_CASES). tests/unit/test_probe.py asserts every case;
tools/error_probe.py writes docs/error-probe.md from them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "configs" / "quickstart_grpo.yaml")
SFT = str(REPO / "configs" / "quickstart_sft.yaml")
PREFERENCE = str(REPO / "configs" / "quickstart_preference.yaml")
GUARD = {"RAY_ADDRESS": "probe-guard"}  # a case that passes every check stops at the cluster check
PROBE_TEST = "tests/unit/test_probe.py::test_probe_case"


class Unavailable(Exception):
    """This machine cannot build a case's input (e.g. a read-only file system); the case is skipped."""


class Workspace:
    """A tiny Llama (4 heads, 2 KV heads, 4 layers, 512 positions), the digits task's data and a fresh
    directory per case; `train`/`show` build command lines that are valid but for what a case changes."""

    def __init__(self, root: Path, model: Path | None = None) -> None:
        """`model`: a tiny Llama already built (tests/conftest.py's), else one is built (≈ 5 s)."""
        from megarl.data.tasks import make_task
        from megarl.models.tiny import build_tiny_hf

        self.root = root
        self.model = model or build_tiny_hf(root / "model")
        self.data = root / "data"
        make_task("digits_sort", self.data, n_train=16, n_val=8, n_sft=16, n_pref=8)
        self.case_dir = root
        self.mounts: list[Path] = []

    def enter(self, case_id: str) -> None:
        self.case_dir = self.root / "cases" / case_id
        self.case_dir.mkdir(parents=True, exist_ok=True)

    def base(self) -> list[str]:
        return [
            f"model.path={self.model}",
            f"data.train_files=[{self.data / 'train.parquet'}]",
            f"data.val_files=[{self.data / 'val.parquet'}]",
            f"trainer.output_dir={self.case_dir / 'run'}",
            "reward.workers=0",
        ]

    def train(self, *overrides: str, config: str = QUICKSTART) -> list[str]:
        return ["train", config, *self.base(), *overrides]

    def show(self, *overrides: str, config: str = QUICKSTART) -> list[str]:
        return ["config", "show", config, *self.base(), *overrides]

    def file(self, name: str, content: str | bytes) -> Path:
        path = self.case_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def parquet(self, name: str, rows: list[dict]) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self.case_dir / name
        pq.write_table(pa.Table.from_pylist(rows), path)
        return path

    def model_copy(self, name: str, drop: tuple[str, ...] = (), config: dict | None = None) -> Path:
        """A copy of the tiny model without the files in `drop`, its config.json updated with `config`."""
        out = self.case_dir / name
        out.mkdir()
        for f in self.model.iterdir():
            if f.name not in drop:
                (out / f.name).write_bytes(f.read_bytes())
        if config is not None and "config.json" not in drop:
            hf = json.loads((out / "config.json").read_text())
            (out / "config.json").write_text(json.dumps({**hf, **config}))
        return out

    def read_only_dir(self) -> Path:
        """A directory this process cannot write: a read-only tmpfs mounted there when run as root (root
        writes through permissions), else one without write permission. Raises Unavailable when neither."""
        import subprocess

        path = self.case_dir / "ro"
        path.mkdir()
        if os.geteuid() != 0:
            path.chmod(0o555)
            return path
        mount = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)]
        if subprocess.run(mount, capture_output=True).returncode != 0:
            raise Unavailable("root without the right to mount: no read-only place to write to")
        self.mounts.append(path)
        return path

    def close(self) -> None:
        import subprocess

        for path in self.mounts:
            subprocess.run(["umount", str(path)], capture_output=True)
        for path in (self.root / "cases").glob("*/ro"):
            path.chmod(0o755)

    def checkpoint_run(self) -> Path:
        """A run directory with one saved actor checkpoint (checkpoints/step_2/actor, manifest included):
        a copy of one built once (≈ 1 s) per workspace."""
        import shutil

        from tests.helpers.checkpoints import fake_run

        built = self.root / "checkpoint_run"
        if not built.is_dir():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch DCP: "torch.distributed is disabled" (one process)
                fake_run(self.model, self.root / "checkpoint_run.partial")
            (self.root / "checkpoint_run.partial").rename(built)
        return Path(shutil.copytree(built, self.case_dir / "run"))


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    case: str  # what the user did
    # writes the inputs and returns the `megarl` argv; None: the case needs a launch, `test` shows it
    make: Callable[[Workspace], list[str]] | None
    expect: tuple[str, ...]  # fragments of the message, each asserted
    exit_code: int
    test: str = PROBE_TEST  # the test that asserts the message
    message: str = ""  # a case not run here: its message, as its test asserts it
    env: tuple[tuple[str, str], ...] = ()  # environment variables the case sets


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    message: str  # what the command printed on stderr, paths shortened
    output: str  # everything it printed


def run_case(case: Case, ws: Workspace) -> Outcome:
    """Run `case` through `megarl.cli.main` in this process; paths under the workspace read `<tmp>`."""
    from megarl.cli import main

    assert case.make is not None, f"{case.id} is shown by {case.test}"
    ws.enter(case.id)
    argv = case.make(ws)
    env = {**GUARD, **dict(case.env)}
    saved = {k: os.environ.get(k) for k in env}
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env)
    # megarl's warnings (rows skipped while loading) reach the terminal through logging's last resort,
    # which pytest's capture replaces: send them to the captured stderr here
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger("megarl").addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's and megatron's notices are not megarl's message
            code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    finally:
        logging.getLogger("megarl").removeHandler(handler)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    message = shorten(err.getvalue() or out.getvalue(), ws).strip()  # a case that passes: its output
    return Outcome(code, message, shorten(out.getvalue(), ws) + message)


def shorten(text: str, ws: Workspace) -> str:
    text = text.replace(str(ws.root / "cases"), "<cases>").replace(str(ws.model), "<tmp>/model")
    text = re.sub(r"<cases>/[\w-]+", "<case>", text.replace(str(ws.root), "<tmp>"))
    return text.replace(str(REPO) + "/", "")


# --- input builders the case tables share ---------------------------------------------------------


def reward_file_case(ws: Workspace, text: str, *more: str) -> list[str]:
    """`megarl train` with `text` as the reward file."""
    return ws.train(f"reward.function.path={ws.file('my_reward.py', text)}", *more)


def convert_case(ws: Workspace, ckpt: Path | str, *more: str) -> list[str]:
    """`megarl convert mcore-to-hf` of `ckpt` into the case's `hf/`."""
    return ["convert", "mcore-to-hf", "--ckpt", str(ckpt), "--out", str(ws.case_dir / "hf"), *more]


def trainer_state_case(ws: Workspace, text: str) -> list[str]:
    """`megarl train` resuming a checkpoint whose trainer_state.json holds `text`."""
    run = ws.checkpoint_run()
    (run / "checkpoints" / "step_2" / "trainer_state.json").write_text(text)
    return ws.train(f"trainer.resume={run / 'checkpoints' / 'step_2'}")
