"""Maps the top-level layer folders into one import namespace, ``mlsys_flows.*``.

``systems/``, ``tasks/``, ``flows/`` and ``blocks/`` stay at the top of the repository (see
README.md, Layout) but install as ``mlsys_flows.systems`` etc., so nothing generic like ``tasks`` lands
in site-packages. The wheel also carries the checkout's files that deployments and reports read
(``PROJECT_FILES``) in ``mlsys_flows/_project/``; ``mlsys_flows.settings.project_root`` finds them.
"""
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

LAYERS = ("systems", "tasks", "flows", "blocks")
# deployment entrypoints (flows/<name>.py:<name>), work-pool templates and cluster specs, committed results;
# MANIFEST.in puts the same files in the sdist, which `python -m build` builds the wheel from
PROJECT_FILES = ("flows/*.py", "infra/**/*", "benchmarks/results/*.json")

# the catalogue's templates folder holds no Python, yet setuptools counts a folder of package data as a
# package: listed (a namespace package), so that its files install without an "absent from packages" warning
packages = ["mlsys_flows"] + [f"mlsys_flows.{p}" for p in find_packages("mlsys_flows")] + \
    ["mlsys_flows.docsgen.templates", "mlsys_flows.docsgen.templates.catalogue"]
package_dir = {"mlsys_flows": "mlsys_flows"}
for layer in LAYERS:
    packages.append(f"mlsys_flows.{layer}")
    packages += [f"mlsys_flows.{layer}.{p}" for p in find_packages(layer)]
    package_dir[f"mlsys_flows.{layer}"] = layer


class BuildWithProjectFiles(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout itself
            return
        target = Path(self.build_lib) / "mlsys_flows" / "_project"
        for pattern in PROJECT_FILES:
            for src in sorted(Path().glob(pattern)):
                if src.is_file():
                    (target / src).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, target / src)


setup(packages=packages, package_dir=package_dir, include_package_data=True,
      package_data={"mlsys_flows.docsgen.templates.catalogue": ["*"]},  # the catalogue's Jinja2 templates
      cmdclass={"build_py": BuildWithProjectFiles})
