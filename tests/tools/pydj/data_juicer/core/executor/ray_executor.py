"""Stand-in for Data-Juicer's Ray executor (see data_juicer/__init__.py):
RayExecutor(cfg) is made by process_data's main() once the flags are
read, as the real one is (esd-dj's claim-ahead gate waits in its
__init__), and its run() does the attempt's work; tools/process_data.py
says what that is."""


class RayExecutor:
    def __init__(self, cfg):
        self.cfg = cfg

    def run(self):
        from data_juicer.tools import process_data

        return process_data.work(self.cfg)
