"""ShEF flow: attested boot on an FPGA board of the pool, then the same accelerator workloads behind no
Shield, one fine-grained Shield, one coarse Shield and ShEF's per-region Shield, repeats interleaved."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.shef import session
from mlsys_flows.systems.shef.result import build_result
from mlsys_flows.tasks import shef as t


@system_flow("shef")
def shef(ctx: RunContext):
    p = ctx.params
    # the user's side: the measurement of its own build, taken here, never by the host that loads the image
    trusted = session.trusted_measurement(p)
    out = ctx.submit(t.shielded_session, p, ctx.storage, ctx.key("session.json"), ctx.devices, trusted,
                     device="fpga").result()
    return build_result(p, out, ctx.repeats)
