"""Runs made on another machine (a rented GPU box, with or without git) and brought home: pack_run.py
runs and archives them there, import_runs.py makes them DVC experiments here, wheelhouse.py carries
DVC to a machine without network."""
