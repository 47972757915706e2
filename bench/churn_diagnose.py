"""Where Volt's placements leave more free GPUs on partly used hosts than best fit would.

    .venv/bin/python bench/churn_diagnose.py [--hosts 10000] [--load 1.1] [--hours 9] [--price-band 0]

Replays bench/churn.py's trace (the whole day's arrivals and failures, as the bench makes them) under Volt
only, up to `--hours` and, at every placement, also asks the best-fit baseline
(clusters.placement.best_fit) for a plan in the same state, without using it. Per request class (one node,
collective multi-node, independent multi-node; by GPUs per node) it sums the GPUs the chosen hosts keep
free after the placement, Volt minus best fit: positive means Volt opened fuller hosts (whole ones) where
best fit filled partly used ones. For one-node requests it also says whether Volt's host was cheaper
than best fit's (rule 5: price first): the count of such placements among those that left more. The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.churn as churn  # noqa: E402
from bench._common import emit_json  # noqa: E402
from clusters.placement import best_fit  # noqa: E402


def request_class(request) -> str:
    if request.nodes == 1:
        kind = "one_node"
    else:
        kind = "collective" if request.is_collective() else "independent"
    return f"{kind}_x{request.gpus_per_node}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=10000)
    parser.add_argument("--hours", type=float, default=9.0, help="replay this much of the day (the fill)")
    parser.add_argument("--day", type=float, default=24.0, help="the trace's length (bench/churn.py --hours)")
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--price-band", type=float, default=0.0)
    args = parser.parse_args()
    placements, excess, cheaper = Counter(), Counter(), Counter()
    place = churn.Cluster.place

    def compared(self, request):
        chosen = place(self, request)
        if chosen is None:
            return None
        listed = [self.hosts[i] for i in self.by_model[request.models[0]] if i not in self.down]
        other = best_fit(request, listed)

        def left(plan) -> int:
            return sum(self.hosts[n.host_id].free_count() - len(n.gpu_indices) for n in plan.nodes)

        key = request_class(request)
        placements[key] += 1
        difference = left(chosen) - left(other)
        excess[key] += difference
        if request.nodes == 1 and difference > 0:
            ours, theirs = self.hosts[chosen.nodes[0].host_id], self.hosts[other.nodes[0].host_id]
            cheaper[key] += ours.price_per_gpu_hour < theirs.price_per_gpu_hour - 1e-9
        return chosen

    churn.Cluster.place = compared
    hosts = churn.generate_inventory(args.hosts, args.seed)
    trace = churn.generate_trace(hosts, args.day, args.load, args.seed)
    outages = churn.failures(hosts, args.day, args.seed)
    figures = churn.simulate(hosts, trace, outages, "volt", args.hours, 8, args.price_band)
    print(f"{args.hosts} hosts, first {args.hours:g} h; Volt utilisation {figures['utilisation']}")
    print("class                placements  GPUs left vs best fit  (one node: of them on a cheaper host)")
    for key in sorted(placements, key=lambda k: -excess[k]):
        extra = f"  ({cheaper[key]})" if key.startswith("one_node") else ""
        print(f"{key:<20} {placements[key]:>10}  {excess[key]:>+21}{extra}")
    emit_json(
        {
            "bench": "churn_diagnose",
            "hosts": args.hosts,
            "hours": args.hours,
            "price_band": args.price_band,
            "placements": dict(placements),
            "gpus_left_vs_best_fit": dict(excess),
            "one_node_on_cheaper_host": dict(cheaper),
        }
    )


if __name__ == "__main__":
    main()
