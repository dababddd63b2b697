"""``alpa-comm schedule``: generate, validate, simulate and draw pipeline schedules."""
from __future__ import annotations

from pathlib import Path

from ..errors import AlpaCommError
from ..report.tables import table
from . import needs
from .options import AUTO_SCHEDULE, add_schedule_args, reject_unused
from .values import count, input_file, number, output_file, png_path

MAX_STAGES = 64
MAX_MICROBATCHES = 4096
GENERATOR_OPTIONS = {"schedule": "--schedule", "stages": "--stages", "microbatches": "--microbatches",
                     "split_backward": "--split-backward", "delay_wgrad": "--delay-wgrad",
                     "model_chunks": "--model-chunks", "memory_cap": "--memory-cap"}


def register(sub) -> None:
    p = sub.add_parser("schedule", help="generate, validate, simulate and draw pipeline schedules",
                       description="Pipeline schedules (GPipe, 1F1B, eager-1F1B, ZB-H1, interleaved 1F1B over virtual stages, "
                                   "ZB-V and DualPipeV over two chunks in a V, split and delayed backward): "
                                   "print them, validate them, simulate them with compute and transfer times, "
                                   "draw them. --compare puts every variant side by side.")
    p.add_argument("--stages", type=count(1, MAX_STAGES), default=4, help="pipeline stages, one per mesh (default 4)")
    p.add_argument("--microbatches", type=count(1, MAX_MICROBATCHES), default=8,
                   help="microbatches per iteration (default 8)")
    add_schedule_args(p, "delay BW: 'auto' (least delay that helps, from the cost model), N, or N0,N1,... per stage",
                      auto=True)
    p.add_argument("--t-fwd", type=number(0, maximum=1e9), default=1.0, help="forward time per stage (default 1)")
    p.add_argument("--t-bwd", type=number(0, maximum=1e9), default=2.0,
                   help="backward time per stage (default 2; BI and BW half each)")
    p.add_argument("--t-comm", type=number(0, maximum=1e9), default=0.5,
                   help="time of one cross-mesh transfer (default 0.5)")
    p.add_argument("--format", choices=["text", "json", "ascii"], default="ascii",
                   help="text/json: print the schedule itself; ascii: simulate and draw (default)")
    p.add_argument("--from-file", type=input_file, help="read a schedule (text form or JSON) instead of generating one")
    p.add_argument("--compare", action="store_true", help="every schedule variant side by side")
    p.add_argument("--png", type=png_path, help="write a timeline PNG here ('.png' added if missing)")
    p.add_argument("--trace", type=output_file, help="write a Chrome trace JSON here")
    p.set_defaults(func=cmd_schedule)


def cmd_schedule(args) -> int:
    from ..pipeline import Costs, compare, memory, simulate_schedule, validate  # noqa: PLC0415
    from ..report.schedule_pictures import ascii_timeline, timeline_png  # noqa: PLC0415
    from ..report.trace import write_chrome_trace  # noqa: PLC0415

    needs.png(args.png)
    if args.t_fwd + args.t_bwd == 0:
        raise AlpaCommError(f"--t-fwd and --t-bwd cannot both be 0 (got {args.t_fwd:g} and {args.t_bwd:g}): "
                            "a schedule of free compute has nothing to simulate")
    costs = Costs(t_fwd=args.t_fwd, t_bwd=args.t_bwd, t_comm=args.t_comm)
    if args.compare:
        reject_unused(args, {"schedule": "--schedule", "split_backward": "--split-backward",
                             "delay_wgrad": "--delay-wgrad", "from_file": "--from-file", "trace": "--trace",
                             "format": "--format", "model_chunks": "--model-chunks", "memory_cap": "--memory-cap"},
                      "with --compare (it builds and draws every variant)")
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
        reject_unused(args, GENERATOR_OPTIONS, "with --from-file (the file is the schedule)")
        sched = _read_schedule(args.from_file)
        label = f"{args.from_file}"
    elif args.schedule == AUTO_SCHEDULE:
        reject_unused(args, {"split_backward": "--split-backward", "delay_wgrad": "--delay-wgrad",
                             "model_chunks": "--model-chunks"}, "with --schedule auto (it chooses them)")
        sched, label = _auto(args, costs)
    else:
        reject_unused(args, {"memory_cap": "--memory-cap"}, "without --schedule auto")
        variant = compare.build(args.schedule, args.stages, args.microbatches, costs, args.split_backward,
                                args.delay_wgrad, args.model_chunks)
        sched, label = variant.schedule, variant.label
    validate(sched)
    S, M = sched.num_stages, sched.num_microbatches
    if args.format != "ascii":
        reject_unused(args, {"png": "--png", "trace": "--trace"}, f"with --format {args.format} (it prints the "
                      "schedule itself; use --format ascii to simulate and draw)")
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
    if sched.virtual:
        print(f"\n{sched.num_chunks} model chunks per stage ({sched.placement} placement): chunk c of stage i "
              f"is model stage {'c*S+i' if sched.placement == 'loop' else 'i, then 2S-1-i'}; labels read F<mb>.<chunk>")
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


def _auto(args, costs):
    """Every schedule this command can simulate, ranked by the simulator under the costs
    given; prints the ranking and returns the pick."""
    from ..pipeline import auto_schedule, simulate_schedule  # noqa: PLC0415

    import sys  # noqa: PLC0415

    cands = auto_schedule.candidates(args.stages, args.microbatches, costs, virtual=True)
    ranked = auto_schedule.rank(cands, args.stages, args.microbatches,
                                lambda s: simulate_schedule(s, costs).iteration_time, memory_cap=args.memory_cap)
    # with --format text/json stdout is the schedule itself: the ranking goes to stderr
    out = sys.stdout if args.format == "ascii" else sys.stderr
    cap = "no memory cap" if args.memory_cap is None else f"memory cap {args.memory_cap:g} microbatches per stage"
    print(f"--schedule auto: {len(ranked)} schedules simulated, {cap}\n", file=out)
    print(table(auto_schedule.HEADERS, auto_schedule.table_rows(ranked)), file=out)
    pick = auto_schedule.choose(ranked)  # after the table, so a cap nothing fits shows every peak
    print(f"\npicked {pick.candidate.label}\n", file=out)
    return pick.schedule, f"auto: {pick.candidate.label}"


def _read_schedule(path: str):
    """A schedule file in JSON (``Schedule.to_json``) or the text form; errors name the file."""
    import json  # noqa: PLC0415

    from ..pipeline import Schedule  # noqa: PLC0415
    from ..pipeline.ir import ScheduleError  # noqa: PLC0415

    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise AlpaCommError(f"--from-file {path!r}: not a text file") from None
    try:
        try:
            json.loads(text)
            is_json = True
        except json.JSONDecodeError:
            is_json = False
        return Schedule.from_json(text) if is_json else Schedule.from_text(text, path)
    except ScheduleError as e:
        raise AlpaCommError(f"--from-file {path!r}: {e}") from None
