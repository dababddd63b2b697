"""The README's headline table, computed from the committed results files.

    python tools/headline.py            # print the table
    python tools/headline.py --write    # put it into README.md between the headline markers

One row per use of alpa_comm: the figure that use is chosen for, the regime it was
measured in, and a link to the results file of the run with the command that wrote it.
Every number is computed here from that run's JSON (never copied from prose), so a
rerun that moves a number moves it in the README too; tests/test_readme.py checks that
README.md holds exactly what this prints.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
BASELINES = ("alpa", "alpa_send_recv", "signal")
"""Methods of an ``alpa-comm bench`` run that are not alpa_comm's plans (Alpa's two, and
the one-byte signal that moves no data)."""
SMALL_CALL_BYTES = 4096
"""A data-plane case this small times a cached call, not bytes (as ``alpa_comm_bench.acceptance``)."""
MODEL_NAMES = {"gpt": "GPT", "utransformer": "U-Transformer"}


def span(values) -> str:
    """``lo-hi`` at the precision the results files print ratios, one value where equal."""
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def nic(name: str) -> str:
    """``400mbit`` -> ``400 Mbit/s`` (the emulated cluster's ``tc`` rate names)."""
    for suffix, unit in (("mbit", "Mbit/s"), ("gbit", "Gbit/s")):
        if name.endswith(suffix):
            return f"{name[:-len(suffix)]} {unit}"
    return name


def bench_rows(saved: dict, suite: str) -> dict[tuple[str, str], dict]:
    """(case, method) -> result of one suite of an ``alpa-comm bench`` run."""
    return {(r["case"], r["method"]): r for r in saved["results"] if r["suite"] == suite}


def cases_of(by: dict) -> list[str]:
    return list(dict.fromkeys(case for case, _ in by))


def alpa_figure(saved: dict) -> tuple[str, str]:
    """Alpa's many-to-many cases: the best of alpa_comm's plans against Alpa's own."""
    by = bench_rows(saved, "n-to-m")
    cases = cases_of(by)
    best = {c: min((r for (case, m), r in by.items() if case == c and m not in BASELINES),
                   key=lambda r: r["median_seconds"]) for c in cases}
    speed = [by[(c, "alpa")]["median_seconds"] / best[c]["median_seconds"] for c in cases]
    bound = [best[c]["median_seconds"] / best[c]["lower_bound_seconds"] for c in cases]
    c = saved["cluster"]
    return (f"Alpa's {len(cases)} many-to-many cases, {c['hosts']} hosts x {c['devices_per_host']} devices, "
            f"{nic(c['nic'])}",
            f"{span(speed)}x faster than Alpa 0.2.3's own resharding; {span(bound)}x the bound")


def jax_figure(saved: dict) -> tuple[str, str]:
    """``jax.Array``s across processes: against JAX's own cross-process ``device_put``."""
    def vs_jax(by, case):
        return by[(case, "jax_device_put")]["median_seconds"] / by[(case, "alpa_comm")]["median_seconds"]

    same, change = bench_rows(saved, "same-layout-processes"), bench_rows(saved, "layout-change-processes")
    moved = [c for c in cases_of(same) if same[(c, "alpa_comm")]["nbytes"] > SMALL_CALL_BYTES]
    raw = [same[(c, "alpa_comm")]["lower_bound_seconds"] / same[(c, "alpa_comm")]["median_seconds"] for c in moved]
    c = saved["cluster"]
    return (f"{c['processes']} JAX processes x {c['devices_per_process']} CPU devices, {nic(c['nic'])}",
            f"same layout {span([vs_jax(same, x) for x in moved])}x faster than `jax.device_put` "
            f"({span(raw)} of raw); layout changes it refuses {span([vs_jax(change, x) for x in cases_of(change)])}x "
            "faster than JAX's best alternative")


def weight_sync_figure(saved: dict) -> tuple[str, str]:
    """RL weight sync: one ``reshard_tree`` call against gather-then-broadcast."""
    by = bench_rows(saved, "weight-sync-processes")
    cases = cases_of(by)
    planned = [by[(c, "planned")] for c in cases]
    gain = [by[(c, "gather_broadcast")]["median_seconds"] / p["median_seconds"] for c, p in zip(cases, planned)]
    bound = [p["median_seconds"] / p["lower_bound_seconds"] for p in planned]
    c = saved["cluster"]
    return (f"{planned[0]['nbytes'] / 2**20:.0f} MiB of weights to inference replicas, {c['processes']} processes, "
            f"{nic(c['nic'])}",
            f"{span(gain)}x faster than gather + gloo broadcast; {span(bound)}x the bound")


def train_figure(saved: dict) -> tuple[str, str]:
    """Pipeline training: ``--schedule auto``'s pick against 1F1B with Alpa's resharding."""
    (model, info), = saved["models"].items()
    auto = info["auto"]
    got = saved["summary"][model][auto["config"]]
    a = saved["args"]
    return (f"{info['model_kwargs']['layers']}-layer {MODEL_NAMES.get(model, model)}, "
            f"{len(info['regime_stages'])} hosts, {nic(a['nic'])}, {a['host_cpus']} core each",
            f"`auto` picks {auto['pick']}: {got['speedup']:.2f}x faster than 1F1B + Alpa's resharding, "
            f"{got['of_signal']:.2f} of the no-communication bound")


@dataclass(frozen=True)
class Row:
    use: str
    results: str
    """The run's folder under benchmarks/results/."""
    command: str
    """The command that wrote it."""
    figure: Callable[[dict], tuple[str, str]]
    """Its JSON -> (regime, figure)."""

    @property
    def folder(self) -> Path:
        return ROOT / "benchmarks" / "results" / self.results

    def json_file(self) -> Path:
        return next(p for p in (self.folder / "results.json", *sorted(self.folder.glob("*.json"))) if p.exists())

    def render(self) -> str:
        regime, figure = self.figure(json.loads(self.json_file().read_text()))
        link = (self.folder / "results.md").relative_to(ROOT)
        return f"| {self.use} | {figure} | {regime} | [results]({link}): `{self.command}` |"


SUDO_BENCH, SUDO_TRAIN = "sudo .venv/bin/alpa-comm bench", "sudo .venv/bin/python benchmarks/train_pipeline.py"
ROWS = (
    Row("Alpa's `comm_optimization`", "emulated",
        f"{SUDO_BENCH} --suite all --size-mb 32 --repeat 3 --out benchmarks/results/emulated", alpa_figure),
    Row("`jax.Array` across processes", "emulated/data_plane_10gbit",
        f"{SUDO_BENCH} --mode processes --suite data-plane --cluster emulated --nic 10gbit --size-mb 128 "
        "--repeat 15 --out benchmarks/results/emulated/data_plane_10gbit", jax_figure),
    Row("RL weight sync", "emulated/weight_sync_processes",
        f"{SUDO_BENCH} --suite weight-sync --mode processes --cluster emulated --nic 400mbit --size-mb 32 "
        "--repeat 5 --out benchmarks/results/emulated/weight_sync_processes", weight_sync_figure),
    Row("pipeline training", "train_emulated_ut_200mbit",
        f"{SUDO_TRAIN} --steps 3 --repeats 3 --models utransformer --out benchmarks/results/train_emulated_ut_200mbit",
        train_figure),
    Row("pipeline training", "train_emulated_gpt_200mbit",
        f"{SUDO_TRAIN} --steps 3 --repeats 3 --models gpt --out benchmarks/results/train_emulated_gpt_200mbit",
        train_figure),
)


def table() -> str:
    """The headline table in markdown."""
    head = ["| use | measured | on the emulated cluster | results: command |", "|---|---|---|---|"]
    return "\n".join(head + [row.render() for row in ROWS])


def readme_block(text: str) -> str:
    """What README text holds between the markers (without the newlines around it)."""
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    return text[text.index(START) + len(START):text.index(END)].strip("\n")


def write(path: Path = README) -> None:
    text = path.read_text()
    readme_block(text)  # the markers are there
    head, tail = text[:text.index(START)], text[text.index(END) + len(END):]
    path.write_text(f"{head}{START}\n{table()}\n{END}{tail}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite README.md's headline block")
    args = p.parse_args(argv)
    if args.write:
        write()
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
