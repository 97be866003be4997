"""Checkpoints: a run's tree of steps, each trained role's full state, and the HF export.

    run.py              a run's checkpoints/ tree: save every role + trainer_state.json atomically, point
                        `latest` at it, prune, and find and check the step to resume from
    paths.py            which role checkpoint a path names (role, step, `latest`, checkpoints/, the run);
                        pure path logic, shared by `trainer.resume` and `megarl convert --ckpt`
    role.py             one trained role's checkpoint: weights, optimizer, LR schedule, RNG; collective
                        save/load at any layout (bit-exact at the saved one)
    role_common.py      what the Megatron roles' checkpoint and the FSDP roles' (megarl.fsdp.checkpoint)
                        share: all-or-none saves, error messages, scheduler.json, the backend check
    format.py           the on-disk format of a checkpoint directory: megarl_checkpoint.json, hf/, the
                        model's dist-checkpoint, staging in `<dir>.partial` and the rename into place
    manifest.py         manifest.json: every file's size and CRC-32, written last, verified on load
    rng_state.py        one rank's RNG states as JSON + safetensors
    safe_load.py        loading megatron dist-checkpoints without running code from the files
    dist_reader.py      full tensors out of a dist-checkpoint one layer at a time, in one process
    hf_export.py        HF safetensors from a live model or from a checkpoint directory
    lora_state.py       a LoRA role's checkpoint: adapters only, its recorded settings, refused mismatches
    lora_export.py      PEFT adapter directories and merged HF models, live or from a LoRA checkpoint
    convert_program.py  the rank program of `megarl convert` (hf-to-mcore, mcore-to-hf)

The HF <-> megatron name and layout tables, TP sharding and HF safetensors I/O are the model's own and
stay in `megarl.models.convert`.
"""
