"""LongBench (v1) and LongBench-E tasks: official prompts, generation lengths and metrics."""
