# (stand-in: see data_juicer/__init__.py; esd-dj --warm imports it, nothing more)
