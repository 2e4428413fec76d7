#!/usr/bin/env python3
"""The paired columns of the book's results page (book/src/results.md), from the run
directories the three AgentRL recipes wrote.

`agentry compare` gives each configuration's mean over seeds with its interval. The results page
also compares two configurations seed by seed: the ablations start from the same warm-up as
the base of the same seed, so a per-seed difference is a difference in RL alone. This prints,
for overall success and each task, the per-seed differences and their mean with a 95%
Student's t interval over the seeds:

    python3 scripts/paired_differences.py runs

It reads only `config.json` and the `eval` lines of each run's `metrics.jsonl` (greedy, labels
`warmup` and `final`). Standard library only.
"""

import glob
import json
import math
import os
import statistics
import sys

# Two-sided 95% quantiles of Student's t, by degrees of freedom.
T95 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105}


def evaluations(run_dir):
    """The greedy evaluations of one run, by label."""
    found = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as lines:
        for line in lines:
            record = json.loads(line)
            if record.get("phase") == "eval" and record.get("decoding", "greedy") == "greedy":
                found[record["label"]] = record
    return found


def runs(root, experiment, config):
    """The runs of one configuration, by seed."""
    by_seed = {}
    for config_file in glob.glob(os.path.join(root, experiment, "**", "config.json"), recursive=True):
        with open(config_file) as f:
            run = json.load(f)
        if run["experiment"] == experiment and run["config"] == config:
            by_seed[run["seed"]] = evaluations(os.path.dirname(config_file))
    return by_seed


def success(evaluation, task):
    return evaluation["success"] if task == "overall" else evaluation["tasks"][task]["success"]


def paired(label, a, b, tasks, a_label="final", b_label="final"):
    """Prints `a - b` per seed and its mean with the t interval, for each task."""
    seeds = sorted(set(a) & set(b))
    print(f"{label} (seeds {', '.join(map(str, seeds))}):")
    for task in tasks:
        if not all(task == "overall" or task in b[s][b_label]["tasks"] for s in seeds):
            continue
        diffs = [success(a[s][a_label], task) - success(b[s][b_label], task) for s in seeds]
        mean = statistics.mean(diffs)
        half = T95[len(diffs) - 1] * statistics.stdev(diffs) / math.sqrt(len(diffs))
        per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
        print(f"  {task:>9}: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]  per seed: {per_seed}")


def main(root):
    base = runs(root, "agentrl", "base")
    if len(base) < 2:
        sys.exit(f"need the runs of at least two seeds of `agentrl` under {root}")
    tasks = ["overall"] + sorted(base[min(base)]["final"]["tasks"])
    paired("RL minus warm-up (agentrl)", base, base, tasks, "final", "warmup")
    for config in ["ablate.pool.cross_policy=0", "ablate.algorithm.advantage_norm=batch"]:
        paired(f"agentrl minus {config}", base, runs(root, "ablations", config), tasks)
    for task in tasks[1:]:
        specialist = runs(root, "specialists", f"specialist.{task}")
        if specialist:
            paired(f"agentrl minus specialist.{task}", base, specialist, [task])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs")
