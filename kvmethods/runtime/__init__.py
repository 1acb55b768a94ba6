"""Running a method: compressed generation, the shared prefill of a grid, layer inputs, group protocols."""
