"""A TEST STAND-IN for Data-Juicer (the package data_juicer), NOT
Data-Juicer: just enough of it for esd-dj (daemon/esd-dj.py) to import and
run, so that tests of esd's warm processor run in well under a second an
attempt. tools/process_data.py says what it does; ray/ beside it is the
matching stand-in for Ray. Used as a checkout: data_juicer.root pointing at
tests/tools/pydj (or a copy), data_juicer.python python3, ray.mode off.
"""
