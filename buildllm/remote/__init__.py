"""Runs made on another machine (a rented GPU box, with or without git) and brought home.

pack_run.py runs the pipeline's stages there with `dvc repro` and adds the run's params.yaml,
dvc.lock and metrics files to one archive (archive.py); import_runs.py turns each run in it into a
DVC experiment here with `dvc exp save`; wheelhouse.py prepares the wheels that carry DVC to a
machine without network.
"""
