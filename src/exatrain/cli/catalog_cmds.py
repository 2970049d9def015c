"""`exatrain models` and `exatrain hardware`: what the catalog holds."""

from __future__ import annotations

import argparse

from exatrain.cli.common import make_console, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list model presets", description="List the model presets.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("hardware", help="list devices and clusters",
                       description="List the devices and clusters in the catalog.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_hardware)


def cmd_models(args: argparse.Namespace) -> int:
    from exatrain.catalog import model_presets
    from exatrain.accounting.params import total_params

    presets = model_presets()
    if args.json:
        print_json([{**m.to_dict(), "params": total_params(m)} for m in presets.values()])
        return 0
    from rich.table import Table

    table = Table(title="model presets")
    for col in ("name", "arch", "layers", "hidden", "heads", "kv", "ffn", "seq", "vocab", "params"):
        table.add_column(col, justify="left" if col in ("name", "arch") else "right")
    for m in presets.values():
        table.add_row(m.name, m.arch, str(m.layers), str(m.hidden), str(m.heads), str(m.kv_heads),
                      str(m.ffn_hidden), str(m.seq_len), str(m.vocab), _human(total_params(m)))
    make_console().print(table)
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from exatrain.catalog import cluster_catalog, device_catalog

    devices, clusters = device_catalog(), cluster_catalog()
    if args.json:
        print_json({"devices": [d.__dict__ for d in devices.values()],
                    "clusters": [c.to_dict() for c in clusters.values()]})
        return 0
    from rich.table import Table

    t = Table(title="devices")
    for col in ("name", "vendor", "bf16 TFLOPS", "fp32 TFLOPS", "memory GiB", "HBM TB/s"):
        t.add_column(col, justify="left" if col in ("name", "vendor") else "right")
    for d in devices.values():
        t.add_row(d.name, d.vendor, _num(d.peak_tflops), _num(d.peak_tflops_fp32),
                  f"{d.hbm_bytes / 2**30:.1f}", f"{d.hbm_bytes_per_s / 1e12:.2f}")
    c = Table(title="clusters")
    for col in ("name", "device", "per node", "link tiers (span: GB/s per rank, latency)"):
        c.add_column(col)
    for cl in clusters.values():
        tiers = "; ".join(f"{t.name} ({t.span or 'network'}: {t.bytes_per_s / 1e9:g} GB/s, "
                          f"{t.latency_s * 1e6:g} us)" for t in cl.tiers)
        c.add_row(cl.name, cl.device.name, str(cl.gpus_per_node), tiers)
    console = make_console()
    console.print(t)
    console.print(c)
    return 0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))
