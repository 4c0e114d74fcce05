"""Operator graphs of torch models through torch.fx, with a stated roofline cost model, so that users
can place their own models. Constants (an accelerator in the class the paper modelled; fp16 tensors):

- accelerator time of an operator = FLOPs / ACC_FLOPS + bytes it reads and writes / ACC_BYTES_S;
- CPU core time = CPU_SLOWDOWN x accelerator time (the ratio in the authors' published layer graphs);
- output cost (moving a node's output to another device) = output bytes / LINK_BYTES_S;
- size on an accelerator = parameter bytes + output bytes.
Times are in milliseconds per sample (batch of one sequence / image). The built-in models
(``builtin``): ``fx_resnet50`` (the default headline graph), ``fx_transformer``, ``fx_resnet``.
"""
from __future__ import annotations

import math

import numpy as np

ACC_FLOPS = 100e12       # dense fp16 FLOP/s
ACC_BYTES_S = 1.0e12     # on-device memory bandwidth, bytes/s
LINK_BYTES_S = 25e9      # device-to-device link, bytes/s (PCIe 4.0 x16 class)
CPU_SLOWDOWN = 10.0
BYTES = 2                # fp16
ASSUMPTIONS = {"acc_flops": (ACC_FLOPS, "FLOP/s"), "acc_bytes_s": (ACC_BYTES_S, "B/s"),
               "link_bytes_s": (LINK_BYTES_S, "B/s"), "cpu_slowdown": (CPU_SLOWDOWN, "x"), "tensor_bytes": (BYTES, "B")}


def _models(name: str, depth: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.act = nn.GELU()

        def forward(self, x):
            h = self.ln1(x)
            q, k, v = self.q(h), self.k(h), self.v(h)
            att = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1])), dim=-1)
            x = x + self.o(att @ v)
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class Transformer(nn.Module):
        def __init__(self, d=512, heads=8, depth=depth):
            super().__init__()
            self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(depth)))

        def forward(self, x):
            return self.blocks(x)

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return self.relu(self.b2(self.c2(self.relu(self.b1(self.c1(x))))) + self.short(x))

    class ResNet(nn.Module):
        def __init__(self, widths=(64, 128, 256, 512), blocks=max(1, depth // 4)):
            super().__init__()
            layers = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()]
            cin = widths[0]
            for i, w in enumerate(widths):
                for b in range(blocks):
                    layers.append(Basic(cin, w, 2 if (b == 0 and i > 0) else 1))
                    cin = w
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(cin, 1000)

        def forward(self, x):
            return self.head(self.body(x).mean(dim=(2, 3)))

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = 4 * width
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if stride != 1 or cin != cout else None)

        def forward(self, x):
            h = self.relu(self.bn1(self.conv1(x)))
            h = self.relu(self.bn2(self.conv2(h)))
            h = self.bn3(self.conv3(h))
            return self.relu(h + (x if self.downsample is None else self.downsample(x)))

    class ResNet50(nn.Module):
        """ResNet-50 (He et al., 2016; torchvision's v1.5 layout: stride on the 3x3 conv): a 7x7 stem and
        max-pool, bottleneck stages of 3, 4, 6 and 3 blocks (widths 64..512, 4x expansion), average
        pool and a 1000-way classifier; 25.6 M parameters."""

        def __init__(self, blocks=(3, 4, 6, 3), widths=(64, 128, 256, 512)):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1, self.relu = nn.BatchNorm2d(64), nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            stages, cin = [], 64
            for i, (n, w) in enumerate(zip(blocks, widths)):
                for b in range(n):
                    stages.append(Bottleneck(cin, w, 2 if (b == 0 and i > 0) else 1))
                    cin = 4 * w
            self.layers = nn.Sequential(*stages)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            return self.fc(torch.flatten(self.avgpool(self.layers(x)), 1))

    if name == "fx_transformer":
        return Transformer(), torch.randn(1, 128, 512)
    if name == "fx_resnet50":
        return ResNet50(), torch.randn(1, 3, 224, 224)
    return ResNet(), torch.randn(1, 3, 224, 224)


def _flops(node, modules, out_numel, in_shapes) -> float:
    from torch import nn

    if node.op == "call_module":
        m = modules[node.target]
        if isinstance(m, nn.Linear):
            return 2.0 * out_numel * m.in_features
        if isinstance(m, nn.Conv2d):
            return 2.0 * out_numel * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
    if node.op == "call_function" and getattr(node.target, "__name__", "") in ("matmul",) and len(in_shapes) == 2:
        return 2.0 * out_numel * in_shapes[0][-1]
    return 5.0 * out_numel  # elementwise, normalisation, softmax: a few FLOPs per element


def from_module(model, example, name: str = "model", accelerators: int = 4, cpus: int = 1,
                memory: float = 16 * 2**30):
    """The operator graph of ``model`` traced with torch.fx on ``example`` (batch of one), costed with
    the module constants; a Graph in the paper's format."""
    import torch
    from torch.fx import symbolic_trace
    from torch.fx.passes.shape_prop import ShapeProp

    from .graph import from_json

    gm = symbolic_trace(model.eval())
    with torch.no_grad():
        ShapeProp(gm).propagate(example)
    modules = dict(gm.named_modules())
    nodes, edges, ids = [], [], {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        meta = node.meta.get("tensor_meta")
        shape = tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else ()
        out_numel = float(np.prod(shape)) if shape else 1.0
        ins = [a for a in node.all_input_nodes if a in ids]
        in_shapes = [tuple(a.meta["tensor_meta"].shape) for a in ins
                     if hasattr(a.meta.get("tensor_meta"), "shape")]
        params = 0.0
        if node.op == "call_module":
            params = float(sum(p.numel() for p in modules[node.target].parameters()))
        if node.op == "placeholder":
            flops, traffic = 0.0, 0.0
        else:
            flops = _flops(node, modules, out_numel, in_shapes)
            traffic = BYTES * (out_numel + sum(float(np.prod(s)) for s in in_shapes) + params)
        acc_ms = 1e3 * (flops / ACC_FLOPS + traffic / ACC_BYTES_S)
        ids[node] = len(nodes)
        nodes.append({"id": len(nodes), "name": node.name, "fpgaLatency": acc_ms, "cpuLatency": CPU_SLOWDOWN * acc_ms,
                      "size": BYTES * (params + out_numel), "supportedOnFpga": 1, "isBackwardNode": 0})
        cost = 1e3 * BYTES * out_numel / LINK_BYTES_S
        for a in ins:
            edges.append((ids[a], ids[node]))
        nodes[-1]["_cost"] = cost
    doc = {"maxSizePerFPGA": memory, "maxFPGAs": accelerators, "maxCPUs": cpus, "nodes": nodes,
           "edges": [{"sourceId": s, "destId": d, "cost": nodes[s]["_cost"]} for s, d in edges]}
    return from_json(doc, name)


def builtin(name: str, depth: int = 8):
    """The built-in models, one node per traced operator (leaf module or function call):

    - ``fx_resnet50``: ResNet-50 inference (bottleneck stages 3-4-6-3, 224x224 image), 176 nodes, on 6
      accelerators and 1 CPU core, the setting of the paper's headline (its ResNet-50 layer graph has
      177 nodes). No coarsening is needed: a block's only parallel branch is its shortcut, so the DP
      enumerates 240 downsets (the published graph: 242) and solves in well under a second; the IP
      runs to its time limit as it does on the published graphs;
    - ``fx_transformer``: ``depth`` pre-LN transformer blocks (d=512, 8 heads, 128 tokens), 4 accelerators;
    - ``fx_resnet``: a ResNet-18-like CNN on a 224x224 image, 4 accelerators.
    """
    model, x = _models(name, depth)
    return from_module(model, x, name, accelerators=6 if name == "fx_resnet50" else 4)
