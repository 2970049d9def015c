"""`exatrain models` and `exatrain hardware`: what the catalog holds."""

from __future__ import annotations

import argparse

from exatrain.cli.common import make_console, opt, print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    for name, help, func in (("models", "list model presets", cmd_models),
                             ("hardware", "list devices and clusters", cmd_hardware)):
        p = sub.add_parser(name, help=help, description=help.capitalize() + " in the catalog.",
                           epilog=f"example: exatrain {name} --json")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)


def cmd_models(args: argparse.Namespace) -> int:
    from exatrain.catalog import model_presets
    from exatrain.api import total_params

    presets = model_presets()
    if args.json:
        print_json([{**m.to_dict(), "params": total_params(m)} for m in presets.values()])
        return 0
    t = table("model presets", ("name", "arch", "layers", "hidden", "heads", "kv", "ffn", "seq", "vocab", "params"),
              left=("name", "arch"))
    for m in presets.values():
        t.add_row(m.name, m.arch, *(str(x) for x in (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.seq_len,
                                                      m.vocab)), _human(total_params(m)))
    make_console().print(t)
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from exatrain.catalog import cluster_catalog, device_catalog

    devices, clusters = device_catalog(), cluster_catalog()
    if args.json:
        print_json({"devices": [d.__dict__ for d in devices.values()],
                    "clusters": [c.to_dict() for c in clusters.values()]})
        return 0
    t = table("devices", ("name", "vendor", "bf16 TFLOPS", "fp32 TFLOPS", "memory GiB", "HBM TB/s"),
              left=("name", "vendor"))
    for d in devices.values():
        t.add_row(d.name, d.vendor, opt(d.peak_tflops, "{:g}"), opt(d.peak_tflops_fp32, "{:g}"),
                  f"{d.hbm_bytes / 2**30:.1f}", f"{d.hbm_bytes_per_s / 1e12:.2f}")
    c = table("clusters", ("name", "device", "per node", "link tiers (span: GB/s per rank, latency)"),
              left=("name", "device", "link tiers (span: GB/s per rank, latency)"))
    for cl in clusters.values():
        c.add_row(cl.name, cl.device.name, str(cl.gpus_per_node), "; ".join(
            f"{t.name} ({t.span or 'network'}: {t.bytes_per_s / 1e9:g} GB/s, {t.latency_s * 1e6:g} us)"
            for t in cl.tiers))
    console = make_console()
    console.print(t)
    console.print(c)
    return 0


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))
