"""Methods that score prompt positions and keep the best (one file a paper)."""
