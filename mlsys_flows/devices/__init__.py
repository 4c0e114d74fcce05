"""Device drivers that tasks and systems use (no Prefect or Dask; the lowest layer): ``fpga``, the FPGA
board interface behind ``ResourcePool(kind="fpga")`` and its software board."""
