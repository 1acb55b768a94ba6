"""Root conftest: the project's own tests drive pytest in-process through ``pytester``."""

pytest_plugins = ["pytester"]
