"""`mlsys_flows.systems` is pure: it imports with prefect, dask and distributed unavailable."""
import subprocess
import sys
import textwrap


def test_systems_import_without_prefect_or_dask():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("prefect", "dask", "distributed", "prefect_dask"):
                    raise ImportError(f"{name} is blocked in this test")
        sys.meta_path.insert(0, Block())
        import mlsys_flows.systems as pkg
        import mlsys_flows.registry, mlsys_flows.settings
        count = 0
        for mod in pkgutil.walk_packages(pkg.__path__, "mlsys_flows.systems."):
            importlib.import_module(mod.name)
            count += 1
        for name in ("prefect", "dask", "distributed"):
            assert name not in sys.modules, name
        print(count)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip().splitlines()[-1]) >= 5  # common modules at least
