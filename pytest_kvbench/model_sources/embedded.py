"""The embedded default model: the name that selects it and the folder it ships in.

Defined here, below the engine (which loads it) and the wiring (whose default grid names it), so that
resolving a model reference needs neither.
"""

from pathlib import Path

DEFAULT_MODEL = "default"
DEFAULT_MODEL_DIR = Path(__file__).parents[1] / "default_model"
