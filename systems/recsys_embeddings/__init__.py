"""Shared harness of the recommendation-embedding training systems FAE, Hotline and Slipstream: a
real two-tier embedding trainer (the model and the fast tier on the trainer's device, CUDA or the
CPU; the full tables in host memory behind a separate slow-tier process), the Criteo-like workload,
hot-row profiling and the staleness rule.

Pure: no prefect/dask imports; torch is imported only by the trainer and device modules, so
importing this package (for the parameters) stays light.
"""
