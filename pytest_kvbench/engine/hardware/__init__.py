"""Hardware figures a paper can print: what ran, and how much memory, energy and time one item took.

``device_description`` says what an item ran on; ``item_meter.ItemMeter`` wraps one item's work and
measures its own peak memory (``cpu_peak_memory``, or CUDA's peak) and energy (``gpu_energy``, through
``nvml``); ``figures`` turns raw counts into the per-model and per-item figures of a record.
"""
