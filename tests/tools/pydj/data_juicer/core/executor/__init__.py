# (stand-in: see data_juicer/__init__.py)
