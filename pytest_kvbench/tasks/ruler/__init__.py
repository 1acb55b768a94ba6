"""RULER synthetic long-context tasks: generators sized with the model's own tokenizer."""
