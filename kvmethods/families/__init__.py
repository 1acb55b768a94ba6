"""Model families as data: what the hooks need to know of a decoder, read off the model, never its name.

`layout.py` holds the description (torch-free dataclasses: each layer's kind, where its queries come from,
whether RoPE enters, its window, its learned sinks) and the one rule table saying which method needs what;
`probe.py` builds the description of a loaded model from its modules, its config and one tiny forward;
`table.py` lists the families the project tests, each described once, for the startup check and
docs/models.md. A family transformers adds later with a known layout is described by the probe like any other.
"""
