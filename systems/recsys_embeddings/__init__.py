"""Shared harness of the recommendation-embedding training systems FAE, Hotline and Slipstream: a
real two-tier embedding trainer (fast tier in the trainer process, the full tables behind a separate
slow-tier process), the Criteo-like workload, hot-row profiling and the staleness rule.

Pure: no prefect/dask imports; torch is imported only by the trainer module, so importing this
package (for the parameters) stays light.
"""
