"""Observability: step metrics to the console and the logging backends (`progress`, `backends`), and
per-rank profiles of chosen steps (`profiling`)."""
