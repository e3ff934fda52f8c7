"""DP few-shot generation (Tang et al. 2024, Algorithm 1) in the method protocol (`tasks.methods`): its plan on a
run's data and its model work.

`method_plan` is its `MethodEntry.plan`: Algorithm 1's parameters for the run (`tasks.calibrate.plan_arguments`:
demos per label from the shots and the labels) and its `FewShotPlan` (`dpcore.fewshot.plan`: a sigma per epsilon
at the largest q = MN/|D_y|, the opted-in non-private rows), held together as a `TangPlan`, whose
`privacy_plans()` are what the run charges for it. `work` is its `MethodEntry.work`: every generated row's token
steps and every demo set's evaluation on the test items, from public sizes (`dpcore.lm.runtime`). Its stages are
tasks/generate.py (stage 4) and tasks/evaluate.py (stage 5); the audit of its demos (stage 6) is the run's
audit (`tasks.audit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcore.config import RunConfig
from dpcore.data.datasets import LoadedDataset
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.plan import INSTRUCTION_ONLY, FewShotPlan, fewshot_plan
from dpcore.lm import runtime
from dpcore.privacy.plan import PrivacyPlan
from tasks.calibrate import plan_arguments


@dataclass(frozen=True)
class TangPlan:
    """DP few-shot generation's part of a run's plan: its `FewShotPlan` (a `Calibration` per epsilon, the
    non-private rows asked for) and the Algorithm 1 parameters it was calibrated for (M, N, T_max, demos per
    label, the mechanism), decided once."""

    fewshot: FewShotPlan
    generation: GenerationConfig

    def privacy_plans(self) -> list[PrivacyPlan]:
        """What the run charges for it, in the ledger's order (`FewShotPlan.privacy_plans`)."""
        return self.fewshot.privacy_plans()


def method_plan(config: RunConfig, data: LoadedDataset, delta: float) -> TangPlan:
    """Its plan on the run's data (`tasks.methods` protocol): sigma per epsilon on the label counts |D_y|
    (`dpcore.fewshot.plan.fewshot_plan`, which refuses an unreachable target or q > 1)."""
    arguments = plan_arguments(config, data.label_counts(), delta)
    return TangPlan(fewshot=fewshot_plan(**arguments), generation=arguments["generation"])


def work(config: RunConfig, plan: TangPlan, *, labels: int, record_tokens: int, test_items: int) -> runtime.Work:
    """Its model work from public sizes (`tasks.methods` protocol): every generated row (an epsilon, sigma = 0,
    instruction-only: the public prompt alone) over every label, then every demo set scored on the test items
    once per seed (the random-real baseline's too), zero-shot once."""
    demos = max(1, math.ceil(config.shots / max(labels, 1)))
    rows = plan.fewshot.generations()
    sizes = dict(labels=labels, num_subsets=config.num_subsets, subset_size=config.subset_size,
                 max_tokens=config.max_tokens, record_tokens=record_tokens)
    generation = sum(runtime.generation_positions(demos_per_label=demos, private=method != INSTRUCTION_ONLY, **sizes)
                     for method, _, _ in rows)
    demo_rows = len(rows) + sum(b == "random-real" for b in config.baselines)
    runs = config.seeds * demo_rows + ("zero-shot" in config.baselines)
    return runtime.Work(generation=generation,
                        evaluation=runtime.evaluation_positions(test_items, labels, runs, record_tokens))
