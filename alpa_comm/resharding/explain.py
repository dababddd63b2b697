"""Human-readable summary of a ``ReshardingPlan``."""
from __future__ import annotations

from collections import Counter

from .strategies import ALLGATHER


def fmt_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    for unit in units:
        if abs(n) < 1024 or unit == units[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} {units[-1]}"


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    if s >= 1e-6 or s == 0:
        return f"{s * 1e6:.1f} us"
    return f"{s * 1e9:.1f} ns"


def explain_plan(plan, max_transfers: int = 12) -> str:
    lines = []
    shape = "x".join(map(str, plan.shape))
    lines.append(f"Resharding {shape} {plan.dtype} ({fmt_bytes(plan.nbytes)})")
    lines.append(f"  from {plan.src_spec} on {plan.src_mesh.label()}  to  {plan.dst_spec} on {plan.dst_mesh.label()}")
    lines.append(f"  cluster: {plan.cluster.describe()}")
    balancer = (plan.loadbalance if plan.loadbalance == plan.loadbalance_used
                else f"{plan.loadbalance} -> {plan.loadbalance_used}")
    strategy = plan.strategy if not plan.strategy_asked else f"{plan.strategy_asked} -> {plan.strategy}"
    lines.append(f"  strategy: {strategy}, loadbalance: {balancer}"
                 + ("" if plan.search_complete else " (search budget ran out; best found)")
                 + ("; served from the plan cache" if plan.cache_hit else ""))
    if plan.sent_spec != plan.dst_spec:
        lines.append(f"  Alpa local-allgather rewrite: network delivers {plan.sent_spec}, "
                     f"then all-gather -> {plan.dst_spec}")
    kinds = Counter(t.kind for t in plan.transfers)
    lines.append(f"  unit tasks: {len(plan.unit_tasks)}; transfers: {len(plan.transfers)} ("
                 + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")")
    lines.append(f"  predicted: {fmt_seconds(plan.predicted_seconds)}   lower bound: "
                 f"{fmt_seconds(plan.lower_bound_seconds)} bandwidth ({plan.ratio_to_lower_bound:.2f}x), "
                 f"{fmt_seconds(plan.latency_bound_seconds)} latency-aware ({plan.ratio_to_latency_bound:.2f}x)")
    if plan.admitted_seconds is not None:
        lines.append(f"  admitted: {fmt_seconds(plan.admitted_seconds)} (transfers overlapped as the executor "
                     "admits them; what auto ranked kinds by)")
    sent, recv = plan.network_bytes()
    hosts = sorted(set(sent) | set(recv))
    if hosts:
        lines.append("")
        lines.append("  host   NIC sent      NIC received")
        for h in hosts:
            lines.append(f"  {h:>4}   {fmt_bytes(sent.get(h, 0)):>11}   {fmt_bytes(recv.get(h, 0)):>11}")
    if max_transfers and plan.transfers:
        lines.append("")
        lines.append(f"  first {min(max_transfers, len(plan.transfers))} of {len(plan.transfers)} transfers "
                     "(start, duration, kind, sender -> receivers, slice):")
        for t in plan.transfers[:max_transfers]:
            sender = "group" if t.kind == ALLGATHER else f"dev{t.sender}"
            recv_s = ",".join(map(str, t.receivers[:8])) + ("..." if len(t.receivers) > 8 else "")
            box = " ".join(f"{a}:{b}" for a, b in t.index)
            chunks = f" K={t.chunks}" if t.chunks > 1 else ""
            lines.append(f"  {fmt_seconds(t.start):>11} {fmt_seconds(t.duration):>11}  {t.kind}{chunks}  "
                         f"{sender} -> [{recv_s}]  [{box}]")
    return "\n".join(lines)
