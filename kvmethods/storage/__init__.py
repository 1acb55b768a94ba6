"""How kept tokens are stored: quantized (KIVI, transformers' backends), ragged per head, thin keys (ThinK)."""
