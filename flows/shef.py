"""ShEF flow: the uniform chunk tuned on a calibration workload, then attested boot on an FPGA board of
the pool and the same accelerator workloads behind no Shield, one fine-grained Shield, the tuned uniform
Shield and ShEF's per-region Shield, repeats interleaved."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.shef import session
from mlsys_flows.systems.shef.result import build_result
from mlsys_flows.systems.shef.workload import variant_configs
from mlsys_flows.tasks import shef as t


@system_flow("shef")
def shef(ctx: RunContext):
    p = ctx.params
    # the user's trust anchor, read once here (pinned in $MLSYS_FPGA_TRUSTED_ROOT, else the software
    # manufacturer's root read now), never by a task from the host's state directory while it verifies
    roots = session.user_trust_anchor()
    # uniform_tuned's chunk: measured on the calibration seed's workload, unless the parameter fixes it
    cal = ctx.submit(t.calibrate, p, ctx.storage, ctx.key("calibration.json"), ctx.devices, roots,
                     device="fpga").result() if not p.tuned_chunk else {"chunk": p.tuned_chunk}
    # the user's side: the measurement of its own build, taken here, never by the host that loads the image
    trusted = session.trusted_measurement(p, variant_configs(p, cal["chunk"]))
    out = ctx.submit(t.shielded_session, p, cal["chunk"], ctx.storage, ctx.key("session.json"), ctx.devices, trusted,
                     roots, device="fpga").result()
    return build_result(p, out, ctx.repeats, cal)
