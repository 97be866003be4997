"""Training data: prompt files in verl's schema and the batches the rollout gets, generated tasks, and how
sequences are batched across ranks and micro-batches.

    files      read parquet / jsonl rows (`DataError`)
    chat       a row's prompt: checks, chat template
    datasets   `PromptDataset`: usable tokenised prompts, bad rows reported; `.batch(indices)`
    sampler    `PromptSampler`: order by (seed, epoch), resumable
    loader     `PromptLoader`: training Batches over epochs, `state_dict()` for resume
    sft        (prompt, response) examples and their batches
    preference chosen/rejected pairs (DPO family) and labelled completions (KTO), and their batches
    tasks      `make_task`: the quickstart's generated digit tasks
    batching   token-balanced splits over data-parallel ranks and micro-batches
"""
