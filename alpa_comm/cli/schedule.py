"""``alpa-comm schedule``: generate, validate, simulate and draw pipeline schedules."""
from __future__ import annotations

from pathlib import Path

from ..report.tables import table
from .options import add_schedule_args


def register(sub) -> None:
    p = sub.add_parser("schedule", help="generate, validate, simulate and draw pipeline schedules",
                       description="Pipeline schedules (GPipe, 1F1B, eager-1F1B, split and delayed backward): "
                                   "print them, validate them, simulate them with compute and transfer times, "
                                   "draw them. --compare puts every variant side by side.")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages, one per mesh (default 4)")
    p.add_argument("--microbatches", type=int, default=8, help="microbatches per iteration (default 8)")
    add_schedule_args(p, "delay BW: 'auto' (least delay that helps, from the cost model), N, or N0,N1,... per stage")
    p.add_argument("--t-fwd", type=float, default=1.0, help="forward time per stage (default 1)")
    p.add_argument("--t-bwd", type=float, default=2.0, help="backward time per stage (default 2; BI and BW half each)")
    p.add_argument("--t-comm", type=float, default=0.5, help="time of one cross-mesh transfer (default 0.5)")
    p.add_argument("--format", choices=["text", "json", "ascii"], default="ascii",
                   help="text/json: print the schedule itself; ascii: simulate and draw (default)")
    p.add_argument("--from-file", help="read a schedule (text form or JSON) instead of generating one")
    p.add_argument("--compare", action="store_true", help="every schedule variant side by side")
    p.add_argument("--png", help="write a timeline PNG here")
    p.add_argument("--trace", help="write a Chrome trace JSON here")
    p.set_defaults(func=cmd_schedule)


def cmd_schedule(args) -> int:
    from ..pipeline import Costs, Schedule, compare, memory, simulate_schedule, validate  # noqa: PLC0415
    from ..report.schedule_pictures import ascii_timeline, timeline_png  # noqa: PLC0415
    from ..report.trace import write_chrome_trace  # noqa: PLC0415

    costs = Costs(t_fwd=args.t_fwd, t_bwd=args.t_bwd, t_comm=args.t_comm)
    if args.compare:
        variants = compare.compare(args.stages, args.microbatches, costs)
        bound = compare.signal_bound(args.stages, args.microbatches, costs)
        limit = compare.comm_limit(args.stages, args.microbatches, costs)
        print(f"S={args.stages} stages, M={args.microbatches} microbatches, t_fwd={args.t_fwd:g}, "
              f"t_bwd={args.t_bwd:g}, t_comm={args.t_comm:g}")
        print(f"signal upper bound (transfers free): {bound:g}; with fill and drain transfers on the critical path "
              f"no schedule beats {limit:g} = {bound / limit:.3f} of the bound\n")
        print(table(compare.HEADERS, compare.rows(variants, args.microbatches, bound)))
        if args.png:
            pick = ([v for v in variants if v.label == "1f1b"]
                    + [v for v in variants if "eager-1f1b + split + auto" in v.label])
            timeline_png([(v.label, v.result, args.stages) for v in pick], args.png)
            print(f"\nPNG: {args.png}")
        return 0
    if args.from_file:
        text = Path(args.from_file).read_text()
        sched = Schedule.from_json(text) if text.lstrip().startswith("{") else Schedule.from_text(text, args.from_file)
        label = f"{args.from_file}"
    else:
        variant = compare.build(args.schedule, args.stages, args.microbatches, costs, args.split_backward,
                                args.delay_wgrad)
        sched, label = variant.schedule, variant.label
    validate(sched)
    S, M = sched.num_stages, sched.num_microbatches
    if args.format == "text":
        print(sched.to_text(), end="")
        return 0
    if args.format == "json":
        print(sched.to_json())
        return 0
    res = simulate_schedule(sched, costs)
    bound = compare.signal_bound(S, M, costs)
    print(f"{label}: S={S}, M={M}, t_fwd={args.t_fwd:g}, t_bwd={args.t_bwd:g}, t_comm={args.t_comm:g}")
    print(ascii_timeline(res, S))
    mem = memory(sched)
    print(f"\niteration time {res.iteration_time:g}   signal bound {bound:g}   "
          f"throughput {bound / res.iteration_time:.3f}"
          f" of the bound   bubble {100 * res.bubble_fraction:.1f} %")
    print("peak live activations per stage (microbatch units): " + " ".join(f"{m.peak_activations:g}" for m in mem))
    if any(m.peak_pending_wgrad for m in mem):
        print("peak pending weight gradients per stage: " + " ".join(str(m.peak_pending_wgrad) for m in mem))
    if args.png:
        timeline_png([(label, res, S)], args.png)
        print(f"PNG: {args.png}")
    if args.trace:
        print(f"Chrome trace: {write_chrome_trace(res, args.trace)}")
    return 0
