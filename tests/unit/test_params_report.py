import json
import math

import pytest
from pydantic import Field

from mlsys_flows.systems.common.params import ParamsError, SystemParams
from mlsys_flows.systems.common.plotting import render_png
from mlsys_flows.systems.common.report import Curve, Environment, Ratio, RunReport, oriented_ratio


class Demo(SystemParams):
    SYSTEM = "demo"
    PRESETS = {"smoke": {"rows": 10}, "quick": {"rows": 1000}}
    rows: int = Field(100, ge=1, le=10**6, description="rows")
    ratio: float = Field(0.5, gt=0, lt=1, description="fraction")


def test_presets_and_overrides():
    assert Demo.for_scale("smoke").rows == 10
    assert Demo.for_scale("quick", rows=7).rows == 7
    assert Demo.for_scale("full").rows == 100  # absent from presets: declared default


@pytest.mark.parametrize("overrides,field", [
    ({"rows": 0}, "rows"), ({"rows": 10**7}, "rows"), ({"rows": "many"}, "rows"),
    ({"ratio": 1.5}, "ratio"), ({"bogus": 1}, "bogus")])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ParamsError) as exc:
        Demo.for_scale("quick", **overrides)
    assert exc.value.field == field
    assert f"'{field}'" in str(exc.value)


def test_bad_scale():
    with pytest.raises(ParamsError, match="scale"):
        Demo.for_scale("huge")


def test_oriented_ratio():
    assert oriented_ratio(2.0, 4.0, "higher") == 2.0   # throughput doubled
    assert oriented_ratio(4.0, 2.0, "lower") == 2.0    # time halved
    assert oriented_ratio(1.0, 0.0, "lower") == math.inf


def _report(**kw):
    variants = {"base": {"t": 4.0, "n": 1.0}, "tech": {"t": 2.0, "n": 1.0}}
    return RunReport(system="demo", title="Demo", paper="p", scale="smoke", run_id="r1", parameters={"rows": 1},
                     variants=variants, headline=Ratio.of(variants, "t", "base", "tech", "lower", 1.5),
                     curves=[Curve(title="loss", x_label="step", y_label="loss",
                                   series={"base": ([0, 1], [1.0, 0.5]), "tech": ([0, 1], [1.0, 0.4])})],
                     environment=Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="abc"),
                     wall_time_s=1.0, **kw)


def test_report_roundtrip_and_summary():
    r = _report(notes=["small scale"])
    assert r.headline.measured_ratio == 2.0
    again = RunReport.model_validate(json.loads(json.dumps(r.model_dump(mode="json"))))
    assert again == r
    md = r.summary_markdown()
    assert "2.00x" in md and "small scale" in md and "| tech |" in md


def test_ratio_missing_variant_is_clear():
    with pytest.raises(KeyError, match="needs variants"):
        Ratio.of({"a": {"x": 1.0}}, "x", "a", "b", "higher")


def test_plot_is_png():
    png = render_png(_report())
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
