"""The one error type of kvmethods.

Bad method names, parameters and budgets are user input (they come from the pytest grid), so they get
a ValueError subclass with a one-line message the grid can show as a usage error.
"""


class MethodError(ValueError):
    """A compression method, parameter, budget or model family that kvmethods cannot use."""
