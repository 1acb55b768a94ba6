"""Errors raised by the task layer.

Three kinds, because the harness reacts differently to each:

* ``TaskError``: the request itself is wrong (unknown task, a context length the model cannot
  hold). A usage error: it is reported before any model is loaded.
* ``TaskUnavailable``: the task is fine but its data is not on this machine (offline, nothing
  cached, no local file). The item is skipped and the message says how to get the data.
* ``DataError``: the data is there but malformed. The message names the file and line so the
  record can be fixed; the item errors.
"""


class TaskError(ValueError):
    """The task request is invalid (unknown name, impossible context length, bad argument)."""


class TaskUnavailable(RuntimeError):
    """The task's data cannot be obtained here; the message says how to get it."""


class DataError(ValueError):
    """A data file or record is malformed; the message starts with ``file:line:``."""
