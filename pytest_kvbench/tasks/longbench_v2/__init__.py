"""LongBench v2 (Bai et al. 2024): 503 multiple-choice questions on long contexts, with and without CoT."""
