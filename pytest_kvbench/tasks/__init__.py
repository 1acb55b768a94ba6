"""Task registry: LongBench and RULER tasks behind one small interface (see DEVELOPERS.md).

Importing this package is cheap: no dataset, tokenizer or metric library is loaded until a
task's samples are loaded or scored.
"""

from .base import Prompt, Sample, Task
from .errors import DataError, TaskError, TaskUnavailable
from .longbench.data import FIXTURE_DIR
from .registry import SUITES, available_tasks, check_context_length, get_task, runnable
from .ruler.task import DEFAULT_CONTEXT_LENGTH, GRID_DEPTHS
from .sources import FIXTURES

__all__ = [
    "DEFAULT_CONTEXT_LENGTH", "FIXTURES", "FIXTURE_DIR", "GRID_DEPTHS", "SUITES",
    "DataError", "Prompt", "Sample", "Task", "TaskError", "TaskUnavailable",
    "available_tasks", "check_context_length", "get_task", "runnable",
]
