"""Maps the top-level layer folders into one import namespace, ``mlsys_flows.*``.

``systems/``, ``tasks/``, ``flows/`` and ``blocks/`` stay at the top of the repository (see
DESIGN.md) but install as ``mlsys_flows.systems`` etc., so nothing generic like ``tasks`` lands
in site-packages.
"""
from setuptools import find_packages, setup

LAYERS = ("systems", "tasks", "flows", "blocks")

packages = ["mlsys_flows"] + [f"mlsys_flows.{p}" for p in find_packages("mlsys_flows")]
package_dir = {"mlsys_flows": "mlsys_flows"}
for layer in LAYERS:
    packages.append(f"mlsys_flows.{layer}")
    packages += [f"mlsys_flows.{layer}.{p}" for p in find_packages(layer)]
    package_dir[f"mlsys_flows.{layer}"] = layer

setup(packages=packages, package_dir=package_dir, include_package_data=True)
