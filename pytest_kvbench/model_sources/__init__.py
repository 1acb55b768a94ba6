"""Where a model's weights come from, found out without importing torch or transformers.

A model reference is ``default`` (the embedded model), a named model (``smollm2-135m``, listed in
``named_models.toml``), a ``.gguf`` file, a local Hugging Face folder or a hub id. The configure-time
checks (wiring/grid/model_refs.py), the loader (engine/models.py) and ``kvbench models`` all resolve it
here, so they agree on what a name means.
"""
