"""Training data: datasets, rewards, and how sequences are batched across ranks and micro-batches."""
