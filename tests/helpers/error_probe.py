"""The error probe: what a new user and an adversary feed megarl, and the one line it answers with.

Each `Case` writes its inputs into a `Workspace` (a tiny Llama, the digits task's data) and returns the
`megarl` command line that meets them; `run_case` runs it in this process through `megarl.cli.main`, the
code path of the `megarl` command, and returns the exit code and the message. No case starts a worker:
the data, reward and checkpoint cases fail while `megarl train` loads its inputs, before the workers
start, and RAY_ADDRESS names no cluster (`probe-guard`), so a case that wrongly passes ends at once at
the cluster check instead of training. Cases that need a launch (signals, concurrent runs) or a fault
injected mid-run name the test that shows them and quote its message.

tests/unit/test_probe.py asserts every case; tools/error_probe.py writes docs/error-probe.md from it.
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


# --- the cases ---------------------------------------------------------------------------------------


def _yaml(ws: Workspace, text: str) -> str:
    return str(ws.file("config.yaml", text))


def _bad_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "actor:\n  parallel: {tp: 2\nrollout:\n  n: 8\n"), "--no-check-paths"]


def _list_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "- actor\n- rollout\n"), "--no-check-paths"]


def _typo_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "rollout:\n  temprature: 0.7\n"), "--no-check-paths"]


def _tab_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "rollout:\n\tn: 8\n"), "--no-check-paths"]


def _data(ws: Workspace, name: str, content: str | bytes, *more: str) -> list[str]:
    return ws.train(f"data.train_files=[{ws.file(name, content)}]", *more)


def _rows(ws: Workspace, name: str, rows: list[dict], *more: str) -> list[str]:
    return ws.train(f"data.train_files=[{ws.parquet(name, rows)}]", *more)


def _row(prompt: object, **extra: object) -> dict:
    row = {
        "data_source": "digits_sort",
        "prompt": prompt,
        "reward_model": {"style": "rule", "ground_truth": "123"},
    }
    return {**row, **extra}


def _reward_file(ws: Workspace, text: str, *more: str) -> list[str]:
    return ws.train(f"reward.function.path={ws.file('my_reward.py', text)}", *more)


def _convert(ws: Workspace, ckpt: Path | str, *more: str) -> list[str]:
    return ["convert", "mcore-to-hf", "--ckpt", str(ckpt), "--out", str(ws.case_dir / "hf"), *more]


def _corrupt_shard(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    shard = next((run / "checkpoints" / "step_2" / "actor" / "model").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return _convert(ws, run)


def _no_manifest(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    (run / "checkpoints" / "step_2" / "actor" / "manifest.json").unlink()
    return _convert(ws, run)


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
    return _convert(ws, run)


def _pickle_common(ws: Workspace) -> list[str]:
    """A `common.pt` (megatron's non-sharded state) holding a code-running pickle, manifest rehashed."""
    import pickle

    from megarl.checkpoint.manifest import write_manifest

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {ws.case_dir / 'PWNED'}",))

    run = ws.checkpoint_run()
    actor = run / "checkpoints" / "step_2" / "actor"
    (actor / "model" / "common.pt").write_bytes(pickle.dumps(Payload()))
    write_manifest(actor)
    return ws.train(f"trainer.resume={run / 'checkpoints' / 'step_2'}")


def _state(ws: Workspace, text: str) -> list[str]:
    run = ws.checkpoint_run()
    (run / "checkpoints" / "step_2" / "trainer_state.json").write_text(text)
    return ws.train(f"trainer.resume={run / 'checkpoints' / 'step_2'}")


def _latest_missing(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    (run / "checkpoints" / "latest").write_text("step_9\n")
    return ws.train(f"trainer.output_dir={run}")


def _read_only_output(ws: Workspace) -> list[str]:
    return ws.train("trainer.output_dir=/proc/megarl-run")


def _broken_config(ws: Workspace) -> Path:
    m = ws.model_copy("m")
    (m / "config.json").write_text('{"model_type": "llama",')
    return m


def _pandas_json(ws: Workspace) -> list[str]:
    """What `DataFrame.to_json("train.json")` writes by default: one object of columns, not rows."""
    prompt = [{"role": "user", "content": "sort 3 1 2"}]
    columns = {"data_source": {"0": "digits_sort"}, "prompt": {"0": prompt}, "reward_model": {"0": {}}}
    return _data(ws, "train.json", json.dumps(columns))


def _rl_state(ws: Workspace, **fields: object) -> list[str]:
    state = {"version": 1, "step": 2, "job": "sft", "data": {"epoch": 0, "position": 32}, **fields}
    return _state(ws, json.dumps(state))


def _read_only_output(ws: Workspace) -> list[str]:
    return ws.train(f"trainer.output_dir={ws.read_only_dir() / 'run'}")


def _sigint_reward(ws: Workspace) -> list[str]:
    """Ctrl-C while `megarl train` loads its inputs: a real SIGINT to this process, sent by the reward file
    as it is imported in the process that checks it (whose parent is `megarl train`)."""
    text = "import os, signal, time\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(5)\n"
    return _reward_file(ws, text)


def _digits_rows(n: int = 16, **extra: object) -> list[dict]:
    return [_row([{"role": "user", "content": "sort 3 1 2"}], **extra)] * n


CASES: list[Case] = [
    # --- config files and keys (`megarl config show` loads exactly as `megarl train` does) ---
    Case(
        "C01",
        "config",
        "YAML syntax error (an unclosed `{`)",
        _bad_yaml,
        ("is not valid YAML", "line 2, column 13", "fix the syntax"),
        2,
    ),
    Case(
        "C02", "config", "a tab indenting a YAML key", _tab_yaml, ("is not valid YAML", "line 2, column 1"), 2
    ),
    Case(
        "C03",
        "config",
        "a config file that is a YAML list",
        _list_yaml,
        ("must be a mapping of sections",),
        2,
    ),
    Case(
        "C04",
        "config",
        "the config file's path mistyped",
        lambda ws: ["config", "show", str(ws.case_dir / "quickstrat.yaml")],
        ("quickstrat.yaml does not exist; check the path",),
        2,
    ),
    Case(
        "C05",
        "config",
        "a misspelled key in the YAML (`rollout.temprature`)",
        _typo_yaml,
        ("unknown key 'rollout.temprature' — did you mean 'rollout.temperature'?",),
        2,
    ),
    Case(
        "C06",
        "config",
        "a misspelled override (`actor.paralel.tp=2`)",
        lambda ws: ws.show("actor.paralel.tp=2"),
        ("unknown key 'actor.paralel' — did you mean 'actor.parallel'?",),
        2,
    ),
    Case(
        "C07",
        "config",
        "a key at the wrong level (`tp=2`)",
        lambda ws: ws.show("tp=2"),
        ("unknown key 'tp' — did you mean 'actor.parallel.tp'",),
        2,
    ),
    Case(
        "C08",
        "config",
        "a misspelled verl key (`actor_rollout_ref.actor.optim.lrr=1e-6`; verl's own keys are translated)",
        lambda ws: ws.show("actor_rollout_ref.actor.optim.lrr=1e-6"),
        (
            "unknown key 'actor_rollout_ref.actor.optim.lrr': neither a megarl key nor a verl key megarl knows; "
            "did you mean 'actor_rollout_ref.actor.optim.lr'?",
        ),
        2,
    ),
    Case(
        "C09",
        "config",
        "a word for a number (`actor.parallel.tp=two`)",
        lambda ws: ws.show("actor.parallel.tp=two"),
        ("actor.parallel.tp=two is invalid: expected an integer; e.g. actor.parallel.tp=1",),
        2,
    ),
    Case(
        "C10",
        "config",
        "a list for a number (`rollout.n=[8]`)",
        lambda ws: ws.show("rollout.n=[8]"),
        ("rollout.n=[8] is invalid: expected an integer",),
        2,
    ),
    Case(
        "C11",
        "config",
        "a number for a list of files (`data.train_files=5`)",
        lambda ws: ws.show("data.train_files=5"),
        ("data.train_files=5 is invalid: expected a list (each item a string)",),
        2,
    ),
    Case(
        "C12",
        "config",
        "a bad choice (`algorithm.adv_estimator=grp`)",
        lambda ws: ws.show("algorithm.adv_estimator=grp"),
        ("algorithm.adv_estimator=grp is invalid: expected one of gae, grpo,",),
        2,
    ),
    Case(
        "C13",
        "config",
        "a bad launcher (`trainer.launcher=slurm`)",
        lambda ws: ws.show("trainer.launcher=slurm"),
        ("trainer.launcher=slurm is invalid: expected one of ray, torchrun",),
        2,
    ),
    Case(
        "C14",
        "config",
        "a word for a boolean (`trainer.val_before_train=maybe`)",
        lambda ws: ws.show("trainer.val_before_train=maybe"),
        ("expected true or false",),
        2,
    ),
    Case(
        "C15",
        "config",
        "a value for a section (`actor=3`)",
        lambda ws: ws.show("actor=3"),
        ("actor is a section, not a value; set its keys (parallel,",),
        2,
    ),
    Case(
        "C16",
        "config",
        "an override without `=` (`actor.parallel.tp`)",
        lambda ws: ws.show("actor.parallel.tp"),
        ("override 'actor.parallel.tp' is not key=value",),
        2,
    ),
    Case(
        "C17",
        "config",
        "a `${...}` reference to a key that does not exist",
        lambda ws: ws.show("trainer.output_dir=${data.nope}"),
        ("trainer.output_dir: Interpolation key 'data.nope' not found; fix the ${...} reference",),
        2,
    ),
    Case(
        "C18",
        "config",
        "a negative learning rate",
        lambda ws: ws.show("actor.optimizer.lr=-1e-6"),
        ("actor.optimizer.lr=-1e-06 must be > 0",),
        2,
    ),
    Case(
        "C19", "config", "`rollout.n=0`", lambda ws: ws.show("rollout.n=0"), ("rollout.n=0 must be ≥ 1",), 2
    ),
    Case(
        "C20",
        "config",
        "an unknown logging backend (`logging.backends=[consol]`)",
        lambda ws: ws.show("logging.backends=[consol]"),
        ("each item one of console, jsonl, tensorboard, wandb",),
        2,
    ),
    Case(
        "C21",
        "config",
        "an SFT config given to `megarl train`",
        lambda ws: ws.train(f"data.train_files=[{ws.data / 'sft.parquet'}]", config=SFT),
        ("algorithm.name=sft is not RL training; run `megarl sft",),
        2,
    ),
    # --- parallel layout and batch sizes ---
    Case(
        "L01",
        "layout",
        "TP not dividing the heads (`actor.parallel.tp=3`, 4 heads)",
        lambda ws: ws.show("actor.parallel.tp=3", "trainer.n_devices_per_node=3"),
        (
            "actor.parallel.tp=3 does not divide num_attention_heads=4 and num_key_value_heads=2; use one of 1, 2",
        ),
        2,
    ),
    Case(
        "L02",
        "layout",
        "PP not dividing the layers (`actor.parallel.pp=3`, 4 layers)",
        lambda ws: ws.show("actor.parallel.pp=3", "trainer.n_devices_per_node=3"),
        ("actor.parallel.pp=3 does not divide num_hidden_layers=4; use one of 1, 2, 4",),
        2,
    ),
    Case(
        "L03",
        "layout",
        "a world size TP×PP does not divide (3 ranks, TP 2)",
        lambda ws: ws.show("actor.parallel.tp=2", "trainer.n_devices_per_node=3"),
        ("tp·pp·cp = 2·1·1 = 2 does not divide the 3 devices of the actor",),
        2,
    ),
    Case(
        "L04",
        "layout",
        "a rollout TP the actor's TP does not divide (`rollout.tp=3`)",
        lambda ws: ws.show("rollout.tp=3"),
        ("rollout.tp=3 does not divide actor.parallel.tp=1",),
        2,
    ),
    Case(
        "L05",
        "layout",
        "train_batch_size not divisible by ppo_mini_batch_size",
        lambda ws: ws.show("data.train_batch_size=12", "algorithm.ppo_mini_batch_size=8"),
        ("algorithm.ppo_mini_batch_size=8 does not divide data.train_batch_size=12",),
        2,
    ),
    Case(
        "L06",
        "layout",
        "the mini-batch's sequences per DP rank not divisible by micro_batch_size",
        lambda ws: ws.show("algorithm.ppo_mini_batch_size=16", "actor.micro_batch_size=3"),
        ("actor.micro_batch_size=3 does not divide the 64 sequences each actor data-parallel rank gets",),
        2,
    ),
    Case(
        "L07",
        "layout",
        "a mini-batch larger than the train batch",
        lambda ws: ws.show("data.train_batch_size=8", "algorithm.ppo_mini_batch_size=16"),
        ("algorithm.ppo_mini_batch_size=16 exceeds data.train_batch_size=8",),
        2,
    ),
    Case(
        "L08",
        "layout",
        "`trainer.n_devices_per_node=0`",
        lambda ws: ws.show("trainer.n_devices_per_node=0"),
        ("trainer.n_devices_per_node=0 must be ≥ 1",),
        2,
    ),
    Case(
        "L09",
        "layout",
        "virtual pipeline without PP (`actor.parallel.vpp=2`)",
        lambda ws: ws.show("actor.parallel.vpp=2"),
        ("actor.parallel.vpp=2 needs actor.parallel.pp > 1",),
        2,
    ),
    # --- the model ---
    Case(
        "M01",
        "model",
        "model.path mistyped",
        lambda ws: ws.show(f"model.path={ws.case_dir / 'Qwen2.5-0.5B'}"),
        ("Qwen2.5-0.5B does not exist; point it at a Hugging Face checkpoint directory",),
        2,
    ),
    Case(
        "M02",
        "model",
        "a model dir without config.json",
        lambda ws: ws.show(f"model.path={ws.model_copy('m', drop=('config.json',))}"),
        ("has no config.json",),
        2,
    ),
    Case(
        "M03",
        "model",
        "a model dir without its tokenizer files (fixed: was transformers' ValueError traceback)",
        lambda ws: ws.train(
            f"model.path={ws.model_copy('m', drop=('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja'))}"
        ),
        (
            "model.path=<case>/m holds no tokenizer transformers can load",
            "it has: config.json, generation_config.json, model.safetensors",
            "set model.tokenizer_path",
        ),
        2,
    ),
    Case(
        "M04",
        "model",
        "model.tokenizer_path mistyped",
        lambda ws: ws.show(f"model.tokenizer_path={ws.case_dir / 'tok'}"),
        ("model.tokenizer_path=<case>/tok does not exist",),
        2,
    ),
    Case(
        "M05",
        "model",
        "a config.json that is not JSON",
        lambda ws: ws.show(f"model.path={_broken_config(ws)}"),
        ("config.json is unreadable (JSONDecodeError", "fix or re-export it"),
        2,
    ),
    Case(
        "M06",
        "model",
        "a model megarl does not build (gpt2) (fixed: was accepted until the workers failed)",
        lambda ws: ws.show(
            f"model.path={ws.model_copy('m', config={'model_type': 'gpt2', 'architectures': ['GPT2LMHeadModel']})}"
        ),
        (
            "is a 'gpt2' model (model_type in its config.json), which megarl does not build; use a checkpoint of one of llama, mistral, qwen2, qwen3",
        ),
        2,
    ),
    Case(
        "M07",
        "model",
        "model.path naming the weights file (fixed: was 'does not exist')",
        lambda ws: ws.show(f"model.path={ws.model / 'model.safetensors'}"),
        (
            "model.safetensors is a file; point it at the Hugging Face checkpoint directory",
            "(e.g. model.path=<tmp>/model)",
        ),
        2,
    ),
    # --- data files (`megarl train` reads them before any worker starts) ---
    Case(
        "D01",
        "data",
        "a train file that does not exist",
        lambda ws: ws.train(f"data.train_files=[{ws.case_dir / 'trian.parquet'}]"),
        ("data.train_files[0]=<case>/trian.parquet does not exist",),
        2,
    ),
    Case(
        "D02",
        "data",
        "an empty .jsonl",
        lambda ws: _data(ws, "train.jsonl", ""),
        ("data.train_files: no rows in <case>/train.jsonl",),
        2,
    ),
    Case(
        "D03",
        "data",
        "a parquet with no rows",
        lambda ws: _rows(ws, "train.parquet", []),
        ("data.train_files: no rows in <case>/train.parquet",),
        2,
    ),
    Case(
        "D04",
        "data",
        "a parquet without the prompt column (`question`)",
        lambda ws: _rows(ws, "train.parquet", [{"question": "sort 3 1 2", "answer": "123"}] * 4),
        ("4 rows: no 'prompt' field (train.parquet row 0", "set data.prompt_key"),
        2,
    ),
    Case(
        "D05",
        "data",
        "`data.prompt_key` naming a missing column",
        lambda ws: ws.train("data.prompt_key=question"),
        ("16 rows: no 'question' field",),
        2,
    ),
    Case(
        "D06",
        "data",
        "a prompt that is a number, not a chat list or a string",
        lambda ws: _rows(ws, "train.parquet", [_row(7)] * 4),
        ("prompt is int, expected a chat list of {role, content} or a string",),
        2,
    ),
    Case(
        "D07",
        "data",
        "a chat list whose messages lack `content`",
        lambda ws: _rows(ws, "train.parquet", [_row([{"role": "user", "text": "hi"}])] * 4),
        ("message 0 has no string 'content' (train.parquet row 0",),
        2,
    ),
    Case(
        "D08",
        "data",
        "a .jsonl with one bad line (line 3), leaving too few rows",
        lambda ws: _data(
            ws,
            "train.jsonl",
            "\n".join(
                [json.dumps(_digits_rows(1)[0])] * 2 + ["{not json"] + [json.dumps(_digits_rows(1)[0])] * 2
            )
            + "\n",
        ),
        (
            "skipped 1 malformed of 5 rows: not valid JSON",
            "train.jsonl line 3",
            "the dataset has 4 usable prompts, fewer than data.train_batch_size=16",
        ),
        2,
    ),
    Case(
        "D09",
        "data",
        "a .jsonl where every line is bad",
        lambda ws: _data(ws, "train.jsonl", "a\nb\n"),
        ("2 rows: not valid JSON (Expecting value) (train.jsonl line 1, train.jsonl line 2)",),
        2,
    ),
    Case(
        "D10",
        "data",
        "a zip file named train.parquet",
        lambda ws: _data(ws, "train.parquet", b"PK\x03\x04" + bytes(200)),
        ("<case>/train.parquet could not be read (ArrowInvalid", "it is not parquet: re-export the data set"),
        2,
    ),
    Case(
        "D11",
        "data",
        "binary bytes named train.jsonl",
        lambda ws: _data(ws, "train.jsonl", bytes(range(256)) * 4),
        ("<case>/train.jsonl could not be read (UnicodeDecodeError", "it is not UTF-8 JSON text"),
        2,
    ),
    Case(
        "D12",
        "data",
        "a .csv file",
        lambda ws: ws.train(f"data.train_files=[{ws.file('train.csv', 'prompt,answer')}]"),
        ("train.csv has an unsupported format; use a .parquet, .jsonl, .json file",),
        2,
    ),
    Case(
        "D13",
        "data",
        "a .json of columns (pandas `to_json()`'s default), not rows",
        _pandas_json,
        ("<case>/train.json holds one JSON object of columns", "orient='records', lines=True"),
        2,
    ),
    Case(
        "D14",
        "data",
        "every prompt longer than data.max_prompt_length",
        lambda ws: ws.train("data.max_prompt_length=4", "data.max_response_length=8"),
        (
            "16 prompts longer than data.max_prompt_length=4 tokens (longest 20)",
            "raise data.max_prompt_length to at least 20",
        ),
        2,
    ),
    Case(
        "D15",
        "data",
        "an unknown data_source (no reward for it)",
        lambda ws: _rows(ws, "train.parquet", _digits_rows(data_source="my_task")),
        ("no reward for data_source 'my_task' (data.train_files)", "set reward.function.path="),
        2,
    ),
    Case(
        "D16",
        "data",
        "a val file without the prompt column",
        lambda ws: ws.train(f"data.val_files=[{ws.parquet('val.parquet', [{'question': 'q'}])}]"),
        ("data.val_files: no usable prompt in <case>/val.parquet",),
        2,
    ),
    Case(
        "D17",
        "data",
        "fewer rows than data.train_batch_size",
        lambda ws: ws.train("data.train_batch_size=32", "algorithm.ppo_mini_batch_size=32"),
        ("the dataset has 16 usable prompts, fewer than data.train_batch_size=32",),
        2,
    ),
    Case(
        "D18",
        "data",
        "`megarl sft` on rows without a response column",
        lambda ws: [
            "sft",
            SFT,
            *ws.base(),
            f"data.train_files=[{ws.parquet('sft.parquet', [{'prompt': 'sort 3 1 2', 'answer': '123'}] * 8)}]",
        ],
        (
            "no usable SFT rows in <case>/sft.parquet",
            "sft.parquet row 0: no column 'response' (data.response_key=response); the columns present: prompt, answer",
        ),
        2,
    ),
    Case(
        "D19",
        "data",
        "`megarl dpo` on pairs without a `chosen` column",
        lambda ws: [
            "dpo",
            PREFERENCE,
            *ws.base(),
            f"data.train_files=[{ws.parquet('pairs.parquet', [{'prompt': 'p', 'good': 'a', 'rejected': 'b'}] * 8)}]",
        ],
        (
            "pairs.parquet row 0: needs `chosen` and `rejected` columns (missing chosen)",
            "no usable preference pairs",
        ),
        2,
    ),
    # --- reward functions (as on main; a reward-file signature check being added may reword R02-R05) ---
    Case(
        "R01",
        "reward",
        "reward.function.path mistyped",
        lambda ws: ws.train(f"reward.function.path={ws.case_dir / 'my_rewrd.py'}"),
        ("reward.function.path=<case>/my_rewrd.py does not exist",),
        2,
    ),
    Case(
        "R02",
        "reward",
        "a reward file with a syntax error",
        lambda ws: _reward_file(
            ws,
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None)\n    return 1.0\n",
        ),
        ("failed to import: SyntaxError: expected ':' (my_reward.py, line 1); fix the file",),
        2,
    ),
    Case(
        "R03",
        "reward",
        "reward.function.name naming no function in the file",
        lambda ws: _reward_file(
            ws, "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
        ),
        (
            "has no reward function 'compute_score': it does not define it; set reward.function.name to one of its functions: score",
        ),
        2,
    ),
    Case(
        "R04",
        "reward",
        "a reward file importing a module that is not installed",
        lambda ws: _reward_file(
            ws, "import math_verify_nope\n\ndef compute_score(*a, **k):\n    return 1.0\n"
        ),
        ("failed to import: ModuleNotFoundError: No module named 'math_verify_nope'",),
        2,
    ),
    Case(
        "R05",
        "reward",
        "a reward file that raises at import",
        lambda ws: _reward_file(ws, "raise RuntimeError('no API key')\n"),
        ("failed to import: RuntimeError: no API key; fix the file",),
        2,
    ),
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
        lambda ws: _state(ws, "{step: 2"),
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
        lambda ws: _convert(ws, ws.checkpoint_run() / "chekpoints"),
        (
            "<case>/run/chekpoints does not exist (<case>/run holds: checkpoints, metrics.jsonl); name a run directory",
        ),
        2,
    ),
    Case(
        "K11",
        "conversion",
        "`convert mcore-to-hf --ckpt` an HF model dir",
        lambda ws: _convert(ws, ws.model),
        ("<tmp>/model is not a megarl checkpoint (no megarl_checkpoint.json)", "megarl convert hf-to-mcore"),
        2,
    ),
    Case(
        "K12",
        "conversion",
        "`convert mcore-to-hf --role critic` of a run without a critic",
        lambda ws: _convert(ws, ws.checkpoint_run(), "--role", "critic"),
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

# --- the 29 cases issue 39 names (fixed and tested there); the cheap ones run here too -----------------


def _save_hf_over_model(ws: Workspace) -> list[str]:
    out = ws.case_dir / "run"
    model = ws.model_copy("m")
    (out).mkdir()
    model.rename(out / "hf")
    return ws.show(f"model.path={out / 'hf'}", "trainer.save_hf=true", f"trainer.output_dir={out}")


def _convert_over_run(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    return ["convert", "mcore-to-hf", "--ckpt", str(run), "--out", str(run), "--overwrite"]


def _convert_over_file(ws: Workspace) -> list[str]:
    return _convert(ws, ws.checkpoint_run())[:-2] + ["--out", str(ws.file("export", "x")), "--overwrite"]


def _dir_named_parquet(ws: Workspace) -> list[str]:
    (ws.case_dir / "x.parquet").mkdir()
    return ws.show(f"data.train_files=[{ws.case_dir / 'x.parquet'}]")


def _state_step_four(ws: Workspace) -> list[str]:
    return _state(ws, json.dumps({"version": 1, "step": "four", "job": "rl"}))


_ISSUE = "tests/unit/"
ISSUE_CASES: list[Case] = [
    Case(
        "I01",
        "concurrency",
        "two runs in one output_dir",
        None,
        (),
        2,
        _ISSUE
        + "trainer/test_run_lock.py::test_megarl_train_in_a_directory_in_use_is_refused_within_seconds",
        "megarl train: error: trainer.output_dir=/x/run is in use by another megarl run: pid 123 on host h, running since 2026-12-06 14:00:00 UTC; lock file /x/run/run.lock. Wait for that run to finish (or stop it), or give this run another trainer.output_dir",
    ),
    Case(
        "I02",
        "outputs",
        "trainer.save_hf=true with model.path = <output_dir>/hf",
        _save_hf_over_model,
        (
            "trainer.save_hf=true writes the Hugging Face model to <case>/run/hf, which is model.path=<case>/run/hf: the export would overwrite the model it starts from",
        ),
        2,
        _ISSUE + "config/test_outputs.py::test_save_hf_over_the_starting_model_is_refused_at_load",
    ),
    Case(
        "I03",
        "conversion",
        "`convert mcore-to-hf --ckpt RUN --out RUN --overwrite`",
        _convert_over_run,
        (
            "--out <case>/run contains the checkpoint --ckpt names (<case>/run/checkpoints/step_2/actor): writing it would overwrite its own input",
        ),
        2,
        _ISSUE + "test_cli.py::test_mcore_to_hf_over_its_own_run_is_refused_and_the_run_kept",
    ),
    Case(
        "I04",
        "signals",
        "SIGKILL / SIGTERM of `megarl train … trainer.launcher=torchrun`",
        None,
        (),
        75,
        "tests/e2e/test_resume.py::test_torchrun_supervisor_sigkilled_rank_killed_then_sigterm_mid_step_saves_it",
        "megarl train: stopped by SIGTERM after step 2: checkpoint <out>/checkpoints/step_2 saved; rerun the same command to resume from it (exit code 75)",
    ),
    Case(
        "I05",
        "concurrency",
        "a second run joining the first's Ray cluster",
        None,
        (),
        2,
        "tests/e2e/test_resume.py::test_two_ray_runs_at_once_each_on_its_own_loopback_cluster_one_sigtermed_then_resumed",
        "each run starts its own loopback cluster; RAY_ADDRESS that does not answer: `RAY_ADDRESS=127.0.0.1:1234 does not answer (nothing listens on 127.0.0.1:1234); start that cluster, or unset RAY_ADDRESS to run on a private one`",
    ),
    Case(
        "I06",
        "resume",
        "resume on another data set of the same size",
        None,
        (),
        2,
        _ISSUE + "trainer/test_resume_checks.py::test_resume_on_other_data_of_the_same_size_names_both_files",
        "/r/checkpoints/step_2 was trained on other data: data.train_files = /d/other.jsonl (123 bytes, sha256 1a2b…); the checkpoint's were /d/train.jsonl (…). Resume with the files it was trained on, or start afresh with trainer.resume=disable (or another trainer.output_dir)",
    ),
    Case(
        "I07",
        "data",
        "rows without a ground truth",
        None,
        (),
        0,
        _ISSUE
        + "data/test_datasets.py::test_rows_without_a_ground_truth_are_reported_when_the_rewards_need_one",
        "data.train_files: skipped 2 malformed of 3 rows: no ground truth (reward_model.ground_truth), which the rule rewards compare with (2: train.parquet row 1, train.parquet row 2)",
    ),
    Case(
        "I08",
        "conversion",
        "convert to a read-only --out",
        None,
        (),
        2,
        _ISSUE + "checkpoint/test_output_safety.py::test_a_read_only_output_is_blamed_not_the_checkpoint",
        "/ro/hf cannot be written (Read-only file system); choose a location you can write to",
    ),
    Case(
        "I09",
        "signals",
        "SIGTERM of the Ray driver",
        None,
        (),
        75,
        "tests/e2e/test_resume.py::test_two_ray_runs_at_once_each_on_its_own_loopback_cluster_one_sigtermed_then_resumed",
        "megarl train: stopped by SIGTERM after step N: checkpoint …/step_N saved; rerun the same command to resume from it (exit code 75)",
    ),
    Case(
        "I10",
        "reward",
        "a reward function that never returns",
        None,
        (),
        0,
        _ISSUE
        + "rewards/test_containment.py::test_every_failure_fails_its_row_only_and_lost_workers_are_replaced",
        "the row fails `timed out after 10s` (reward.timeout_s), counted in reward/errors",
    ),
    Case(
        "I11",
        "reward",
        "countdown answer `99**98**97`",
        None,
        (),
        0,
        _ISSUE + "rewards/test_rules.py::test_countdown_never_evaluates_powers_or_unbounded_answers",
        "scores as a wrong equation (0.1) in < 0.1 s",
    ),
    Case(
        "I12",
        "config",
        "`actor.optimizer.lr=nan`",
        lambda ws: ws.show("actor.optimizer.lr=nan"),
        ("actor.optimizer.lr=nan is not a finite number; set a finite value, e.g. actor.optimizer.lr=",),
        2,
        _ISSUE + "config/test_field_checks.py::test_every_float_key_set_to_nan_or_inf_is_named_alone",
    ),
    Case(
        "I13",
        "config",
        "`rollout.temperature=inf`",
        lambda ws: ws.show("rollout.temperature=inf"),
        ("rollout.temperature=inf is not a finite number; set a finite value, e.g. rollout.temperature=1.0",),
        2,
        _ISSUE + "config/test_field_checks.py::test_every_float_key_set_to_nan_or_inf_is_named_alone",
    ),
    Case(
        "I14",
        "config",
        "max_prompt_length above the model's positions",
        lambda ws: ws.show("data.max_prompt_length=1000"),
        (
            "data.max_prompt_length + data.max_response_length = 1000 + 8 = 1008 tokens exceed the 512 positions of the model at model.path",
        ),
        2,
        _ISSUE
        + "config/test_lengths.py::test_prompt_plus_response_above_the_positions_names_both_numbers_and_keys",
    ),
    Case(
        "I15",
        "layout",
        "64 ranks on a 2-CPU machine",
        None,
        (),
        2,
        _ISSUE + "config/test_machine.py::test_64_ranks_on_2_cpus_name_the_keys_to_change",
        "trainer.n_devices_per_node=64 asks for 64 ranks on this machine, which has no GPU and 2 CPU cores, so at most 16 CPU processes (2 per core, at least 16); set trainer.n_devices_per_node=16 or less (…), or run on a cluster (trainer.nnodes > 1, or a Ray cluster named by RAY_ADDRESS)",
    ),
    Case(
        "I16",
        "resume",
        "'rerun to resume' where nothing was saved",
        None,
        (),
        1,
        _ISSUE + "checkpoint/test_resume_advice.py::test_no_checkpoint_yet_says_the_rerun_starts_from_step_0",
        "no checkpoint was saved under RUN/checkpoints, so rerunning starts from step 0 (trainer.save_every=N saves every N steps)",
    ),
    Case(
        "I17",
        "config",
        "`algorithm.kl_loss_coef=nan`",
        lambda ws: ws.show("algorithm.kl_loss_coef=nan"),
        (
            "algorithm.kl_loss_coef=nan is not a finite number; set a finite value, e.g. algorithm.kl_loss_coef=0.001",
        ),
        2,
        _ISSUE + "config/test_field_checks.py::test_every_float_key_set_to_nan_or_inf_is_named_alone",
    ),
    Case(
        "I18",
        "data",
        "a directory named `x.parquet`",
        _dir_named_parquet,
        (
            "data.train_files[0]=<case>/x.parquet is a directory, not a data file, and holds no .parquet, .jsonl or .json file; name a data file",
        ),
        2,
        _ISSUE
        + "config/test_data_files.py::test_a_directory_named_like_a_parquet_file_is_not_reported_missing",
    ),
    Case(
        "I19",
        "data",
        "one 20 MB prompt",
        None,
        (),
        0,
        _ISSUE
        + "data/test_lengths.py::test_prompts_far_beyond_the_bound_are_dropped_untokenised_and_counted_per_file",
        "data.train_files: dropped 1 prompt longer than data.max_prompt_length=64 tokens (1 over 1536 characters, not tokenised) in with_big.parquet: 1 (row 64); raise data.max_prompt_length to keep them",
    ),
    Case(
        "I20",
        "reward",
        "`sys.exit(3)` in a reward file at import",
        lambda ws: _reward_file(ws, "import sys\nsys.exit(3)\n"),
        (
            "reward.function.path=<case>/my_reward.py called sys.exit(3) while being imported; a reward file must only define functions at import",
        ),
        2,
        _ISSUE + "rewards/test_computer.py::test_loading_a_reward_file_reports_what_is_wrong",
    ),
    Case(
        "I21",
        "reward",
        "`compute_score = 5` in a reward file",
        lambda ws: _reward_file(ws, "compute_score = 5\n"),
        ("has no reward function 'compute_score': it defines compute_score as int, not a function",),
        2,
        _ISSUE + "rewards/test_computer.py::test_loading_a_reward_file_reports_what_is_wrong",
    ),
    Case(
        "I22",
        "reward",
        "a reward returning None/str/NaN on every row",
        None,
        (),
        1,
        _ISSUE
        + "rewards/test_containment.py::test_the_computer_counts_failed_rows_and_stops_past_max_error_fraction",
        "reward function compute_score from /x/my_reward.py failed on 3 of 4 rows of this step (reward.max_error_fraction=0.5 allows 2); the first, batch row 1, …: TypeError: … Fix the function (its first failure is logged above with the traceback), or raise reward.max_error_fraction …",
    ),
    Case(
        "I23",
        "disk",
        "disk full mid-save",
        None,
        (),
        1,
        _ISSUE
        + "checkpoint/test_run.py::test_a_full_disk_mid_save_is_one_message_and_the_previous_checkpoint_stays_latest",
        "megarl train: saving checkpoint step_4 failed: no space left on the device of /r/checkpoints (a checkpoint takes about 1.2 GB, 3.0 MB free); the unfinished save was removed and the previous checkpoint step_2 is intact and `latest` still names it. Free some space (trainer.max_checkpoints keeps fewer checkpoints) or move trainer.output_dir to a larger disk, then rerun to resume",
    ),
    Case(
        "I24",
        "resume",
        "total_steps below the checkpoint's step",
        None,
        (),
        0,
        _ISSUE
        + "trainer/test_resume_checks.py::test_a_run_already_at_its_last_step_says_there_is_nothing_left",
        "megarl: /r/checkpoints/step_8 is at step 8 and this run ends at step 5 (trainer.total_steps or its epochs): nothing left to train. Raise trainer.total_steps to train further, or start afresh with trainer.resume=disable",
    ),
    Case(
        "I25",
        "resume",
        'trainer_state.json with `"step": "four"`',
        _state_step_four,
        ("trainer_state.json: field 'step' is \"four\", not a whole number ≥ 0; the file is damaged",),
        2,
        _ISSUE + "checkpoint/test_run.py::test_a_damaged_trainer_state_names_the_file_and_the_field",
    ),
    Case(
        "I26",
        "conversion",
        "`convert --out <existing file> --overwrite`",
        _convert_over_file,
        (
            "--out <case>/export is a file, not a directory; --overwrite replaces an earlier export or conversion only",
        ),
        2,
        _ISSUE
        + "checkpoint/test_output_safety.py::test_overwrite_of_a_file_is_refused_and_leaves_no_partial",
    ),
    Case(
        "I27",
        "checkpoint",
        "a truncated shard in a checkpoint without a manifest",
        None,
        (),
        2,
        _ISSUE
        + "checkpoint/test_output_safety.py::test_a_truncated_shard_without_a_manifest_is_named_and_leaves_no_partial",
        "/c is damaged: /c/model/__0_0.distcp is truncated: N bytes, its records need M; export an earlier checkpoint or convert again",
    ),
    Case(
        "I28",
        "security",
        "Ray listening on every interface",
        None,
        (),
        0,
        "tests/ray/test_worker_group.py::test_the_session_cluster_is_named_and_listens_on_loopback_only",
        "every Ray listener of a private cluster on 127.0.0.1",
    ),
    Case(
        "I29",
        "security",
        "metrics endpoints answering without the token",
        None,
        (),
        0,
        "tests/ray/test_worker_group.py::test_the_session_cluster_is_named_and_listens_on_loopback_only",
        "dashboard and Ray's metrics exporter off",
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
        _ISSUE + "checkpoint/test_role.py::test_no_code_unpickling_forces_weights_only_torch_load",
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
