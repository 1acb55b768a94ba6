"""Attention plumbing: the forward hooks that compress during prefill, ragged and KVzip attention, kernel memo."""
