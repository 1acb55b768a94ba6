"""SCBench (Li et al. 2024, arXiv 2412.10319): shared-context tasks, one question per sample for now."""
