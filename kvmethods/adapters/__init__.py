"""The outside world: transformers' calling conventions and kvpress presses."""
