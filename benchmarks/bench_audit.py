"""Benchmark: what the membership audit's attacks cost, against Duan et al.'s single attack.

The same DP audit (`dpcore.audit.procedures.dp_audit`: DP demo sets generated from the member half of the
private split, trials of members vs non-members of the demo's label) runs on the same records and
the same prompts (one trial seed, one noise seed) with each attack set:

- `duan`: the single attack, the prompt under audit only (one forward pass per record; its
  reference passes are skipped: the benchmark's stand-in, not a product setting);
- `calibrated` (the default): duan, label-calibrated and text-calibrated: the prompt under audit
  and the no-demonstration reference (2 passes per record);
- `calibrated, next epsilon`: the default audit of a second epsilon of the same run on the same
  trials (the pipeline draws every epsilon's trials with one seed): its references come from the
  first's (`mia_attacks.reference_scores`' cache), so it costs the target passes only;
- `lira` (with `--lira R`): the five attacks, R OUT prompts more (2 + R passes per record).

Each row: wall seconds of the whole audit (DP generation, scoring, statistics) and of its scoring
alone (the model passes over the candidates), each with its ratio to `duan`, the (record, prompt)
pairs scored and the tokens the scoring passes ran. The generation's share is the same in every
row and shrinks as trials grow: at the planner's sizes the scoring dominates. The records are SST-2's shipped
public benchmark; their text is never printed or written.

    python benchmarks/bench_audit.py [--model smollm2-135m|tiny] [--dataset sst2] [--members 15]
                                     [--trials 4] [--demo-sets 3] [--lira R] [--batch-size 16]
                                     [--threads T] [--device cpu] [--out FILE] [--json]

The default sizes are the planner's members per trial and demo sets for `dpicl run --dataset sst2`
with fewer trials per demo set (the cost per trial is constant). With --json the last line printed
is one JSON object; the same object is written to --out (default
$DPICL_HOME/benchmarks/bench_audit.json).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (a `benchmarks` package may be installed)

from benchlib import load, model_parser, report  # noqa: E402


def _parse(argv):
    parser = model_parser(__doc__.split("\n\n")[0], dataset="sst2")
    parser.add_argument("--members", type=int, default=15, help="members (and as many non-members) per trial")
    parser.add_argument("--trials", type=int, default=4, help="trials per demo set")
    parser.add_argument("--demo-sets", type=int, default=3)
    parser.add_argument("--lira", type=int, default=0, metavar="R", help="also the five attacks with R OUT prompts")
    parser.add_argument("--max-tokens", type=int, default=12, help="tokens of each generated demo")
    parser.add_argument("--seed", type=int, default=0, help="member split, trials and noise")
    return parser.parse_args(argv)


class _Counter:
    """Wraps `mia_attacks.prompt_scores`: the (record, prompt) pairs an audit scores."""

    def __init__(self, scores):
        self.scores, self.pairs, self.seconds = scores, 0, 0.0

    def __call__(self, lm, spec, demos, texts, labels, **kwargs):
        self.pairs += len(texts)
        began = time.perf_counter()
        try:
            return self.scores(lm, spec, demos, texts, labels, **kwargs)
        finally:
            self.seconds += time.perf_counter() - began


def _no_references(lm, spec, texts, labels, out_demos, batch_size=16, cache=None, should_stop=None):
    """The single attack's stand-in for the reference passes: zeros, no forward pass (duan reads none)."""
    import numpy as np

    from dpcore.audit.attacks import PromptScores, References

    zero = np.zeros(len(texts))
    return References(PromptScores(zero, zero, zero), None)


def run(args) -> dict:
    from unittest import mock

    import numpy as np
    import torch

    from dpcore.audit import attacks as mia_attacks
    from dpcore.audit import procedures as audit
    from dpcore.audit.config import AuditConfig
    from dpcore.fewshot.config import GenerationConfig

    spec, dataset, lm = load(args)
    members, non_members = audit.split_members(dataset.train, seed=args.seed)
    generation = GenerationConfig(num_subsets=4, subset_size=1, max_tokens=args.max_tokens, top_k=100)

    def one(name: str, reference_prompts: int, *, references=None, cache=None, trials=args.trials,
            demo_sets=args.demo_sets) -> dict:
        config = AuditConfig(trials=trials, demo_sets=demo_sets, members=args.members,
                             non_members=args.members, reference_prompts=reference_prompts)
        counter = _Counter(mia_attacks.prompt_scores)
        tokens = lm.stats.tokens
        with contextlib.ExitStack() as patched:
            patched.enter_context(mock.patch.object(mia_attacks, "prompt_scores", counter))
            if references is not None:
                patched.enter_context(mock.patch.object(mia_attacks, "reference_scores", references))
            began = time.perf_counter()
            result = audit.dp_audit(lm, spec, members, non_members, config, generation, 1.0, seed=args.seed,
                                    epsilon=4.0, delta=1e-5, crosscheck_agreed=True, noise_seed=args.seed,
                                    batch_size=args.batch_size, cache=cache)
            seconds = time.perf_counter() - began
        scored = int(result.mia_scores.drop_duplicates(["demo_set", "record_id"]).shape[0])
        return {"attack_set": name, "attacks": len(result.attacks) if references is None else 1,
                "seconds": seconds, "scoring_seconds": counter.seconds, "records": scored, "pairs_scored": counter.pairs,
                "passes_per_record": counter.pairs / scored, "model_tokens": lm.stats.tokens - tokens,
                "duan_scores": np.sort(result.mia_scores.loc[result.mia_scores["attack"] == "duan", "score"]
                                       .to_numpy()).tolist()}

    one("warm-up", 0, references=_no_references, trials=1, demo_sets=1)  # model, tokenizer and allocator warm
    rows = [one("duan", 0, references=_no_references)]
    shared: dict = {}
    rows.append(one("calibrated", 0, cache=shared))
    rows.append(one("calibrated, next epsilon", 0, cache=shared))
    if args.lira >= 2:
        rows.append(one(f"lira (R={args.lira})", args.lira))
    base = rows[0]["seconds"]
    same_prompts = all(np.allclose(r["duan_scores"], rows[0]["duan_scores"], atol=1e-5) for r in rows[1:3])
    for row in rows:
        row["ratio"] = row["seconds"] / base
        row["scoring_ratio"] = row["scoring_seconds"] / rows[0]["scoring_seconds"]
        row.pop("duan_scores")
    return {
        "benchmark": "audit", "model": lm.name, "device": str(lm.device), "threads": torch.get_num_threads(),
        "dataset": spec.name, "members": args.members, "trials_per_demo_set": args.trials,
        "demo_sets": args.demo_sets, "batch_size": args.batch_size, "rows": rows,
        "ratio_default_to_duan": rows[1]["ratio"], "same_records_and_prompts": bool(same_prompts),
    }


def format_table(result: dict) -> str:
    lines = [
        f"membership audit: {result['dataset']}, {result['demo_sets']} demo sets x {result['trials_per_demo_set']} "
        f"trials of {result['members']} vs {result['members']} records, model {result['model']} on "
        f"{result['device']} ({result['threads']} threads), batch {result['batch_size']}",
        f"{'attack set':<26} {'attacks':>7} {'seconds':>8} {'x duan':>7} {'scoring s':>9} {'x duan':>7} "
        f"{'records':>8} {'passes/record':>13} {'model tokens':>13}",
    ]
    for row in result["rows"]:
        lines.append(f"{row['attack_set']:<26} {row['attacks']:>7} {row['seconds']:>8.1f} {row['ratio']:>7.2f} "
                     f"{row['scoring_seconds']:>9.1f} {row['scoring_ratio']:>7.2f} {row['records']:>8} "
                     f"{row['passes_per_record']:>13.2f} {row['model_tokens']:>13}")
    lines.append(f"default audit / single attack: {result['ratio_default_to_duan']:.2f}x   same records and "
                 f"prompts: {result['same_records_and_prompts']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse(argv)
    result = run(args)
    return report(result, format_table(result), "bench_audit", args.out, args.json)


if __name__ == "__main__":
    sys.exit(main())
