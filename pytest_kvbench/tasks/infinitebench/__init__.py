"""InfiniteBench (Zhang et al. 2024): the 12 tasks of OpenBMB/InfiniteBench with their scorers."""
