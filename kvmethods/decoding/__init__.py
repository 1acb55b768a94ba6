"""Compression while decoding (R-KV and the decoding-time machinery)."""
