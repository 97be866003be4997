"""The torchrun entry: every rank runs the same megarl job (the runner is `megarl.cli.job`).

    torchrun --nproc_per_node 2 -m megarl.train CONFIG trainer.launcher=torchrun [key=value ...]
    torchrun --nnodes N ... -m megarl.train ...     # several nodes: launch/torchrun/node.sh, launch/slurm/
    python -m megarl.train CONFIG --job sft ...     # --job: train (RL, the default), sft, dpo, ...

`megarl train CONFIG trainer.launcher=torchrun` starts this itself on one node.
"""

import sys

from megarl.cli.job import main

if __name__ == "__main__":
    sys.exit(main())
