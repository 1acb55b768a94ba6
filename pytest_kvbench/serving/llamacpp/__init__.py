"""llama.cpp as a serving backend, through the xllamacpp wheel (the ``[llamacpp]`` extra)."""
