"""Stand-in for ray.data (see ray/__init__.py): DataContext with the
execution option esd-dj sets."""


class ExecutionOptions:
    def __init__(self):
        self.preserve_order = False


class DataContext:
    _current = None

    def __init__(self):
        self.execution_options = ExecutionOptions()

    @classmethod
    def get_current(cls):
        if cls._current is None:
            cls._current = cls()
        return cls._current
