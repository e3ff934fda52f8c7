"""Planning a membership audit before it runs: can it conclude, and at what size.

The gate (`dpcore.audit.gate`) passes only when every attack's interval of the mean per-trial AUC
(`audit_statistics.auc_mean_ci`: Student-t over the independent trials, per-trial variance floored at
the Hanley-McNeil no-leak variance, Bonferroni over the attacks) lies inside 0.5 +/- tolerance. How
wide that interval can be is known before a single record is scored: it depends only on the sizes.
With m members and k non-members per trial and n independent trials,

    half-width = t_{1 - a/2}(n - 1) * sqrt(v0 / n),   v0 = (m + k + 1) / (12 m k),   a = (1 - confidence) / attacks,

and n is at most the trials asked and what each pool can fill disjointly (pool // per trial): a
small pool caps m * n, so no number of trials helps past it. When nothing leaks each attack's mean
AUC is about N(0.5, v0 / n), so the audit concludes (every interval inside the band) with probability

    P >= 1 - attacks * 2 * (1 - Phi((tolerance - half-width) / sqrt(v0 / n)))

(a union bound over the attacks). `plan` (one pool on each side: a released prompt's audit) and
`plan_by_label` (Tang et al.'s per-label demo sets) give a design's half-width and that probability;
`cheapest` the design with the fewest scored records that concludes with probability at least
`TARGET_PROBABILITY` (or, when none can, the narrowest); `pool_needed` the smallest pool on each side
for which one exists; `tolerance_reachable` the band the pools can support.

Only sizes go in: pool sizes, trials, members per trial. The pools' sizes are counts of the private
split and of the records a mechanism read (set by the public plan and the sampler), never of what a
record says.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from scipy import stats

from dpcore.config import flag
from dpcore.errors import ConfigError
from dpcore.public_outputs import Kind, declare_line

# A no-leak audit should conclude at least this often: a release gate that a sound prompt fails one
# time in three is a gate users learn to bypass.
TARGET_PROBABILITY = 0.9
# Below this an audit is not worth its minutes: it is said (and, unless its sizes were asked for, skipped).
MIN_PROBABILITY = 0.25
MAX_TRIALS = 50  # past this the t quantile gains nothing a larger per-trial sample would not


@dataclass(frozen=True)
class AuditDesign:
    """The sizes of one audit and what they can tell (see the module docstring)."""

    members: int  # per trial
    non_members: int  # per trial
    trials: int
    independent_trials: int
    attacks: int
    confidence: float
    tolerance: float
    half_width: float  # of each attack's interval when nothing leaks
    conclusive_probability: float  # P(every interval inside the band | no leak), a lower bound
    scored_records: int = 0  # (record, prompt) pairs scored, each against every attack's prompts: its cost

    @property
    def conclusive(self) -> bool:
        return self.conclusive_probability >= TARGET_PROBABILITY

    def to_dict(self) -> dict:
        return {**asdict(self), "conclusive": self.conclusive}


def null_variance(members: int, non_members: int) -> float:
    """Hanley-McNeil variance of one trial's AUC when nothing leaks (as `audit_statistics` floors it)."""
    return (members + non_members + 1) / (12.0 * members * non_members)


@functools.lru_cache(maxsize=4096)
def _t_quantile(confidence: float, attacks: int, dof: int) -> float:
    level = 1.0 - (1.0 - confidence) / attacks  # Bonferroni over the attacks, as the gate reads them
    return float(stats.t.ppf(0.5 + level / 2, dof))


def design(independent: int, *, members: int, non_members: int, trials: int, attacks: int, confidence: float,
           tolerance: float, scored: int = 0) -> AuditDesign:
    """The design of `trials` trials of `members` + `non_members` records, `independent` of them disjoint,
    scoring `scored` (record, prompt) pairs."""
    for name, value in (("members", members), ("non_members", non_members), ("trials", trials),
                        ("attacks", attacks)):
        if value < 1:
            raise ConfigError(f"{name}: must be >= 1, got {value}")
    if independent < 2:
        half, probability = math.inf, 0.0
    else:
        spread = math.sqrt(null_variance(members, non_members) / independent)
        half = _t_quantile(confidence, attacks, independent - 1) * spread
        margin = tolerance - half
        tail = 0.5 * math.erfc(margin / spread / math.sqrt(2))  # P(N(0, 1) > margin / spread)
        probability = 0.0 if margin <= 0 else max(0.0, 1.0 - attacks * 2.0 * tail)
    return AuditDesign(members, non_members, trials, independent, attacks, confidence, tolerance, half, probability,
                       scored)


def plan(member_pool: int, non_member_pool: int, *, members: int, non_members: int, trials: int, attacks: int,
         confidence: float, tolerance: float) -> AuditDesign:
    """`design` of trials drawn from one member pool and one non-member pool (a released prompt's audit:
    `dpcore.audit.procedures.prompt_audit`)."""
    return design(_fillable(member_pool, non_member_pool, members, non_members, trials), members=members,
                  non_members=non_members, trials=trials, attacks=attacks, confidence=confidence, tolerance=tolerance,
                  scored=_scored(member_pool, non_member_pool, members, non_members, trials))


def plan_by_label(member_pools: Sequence[int], non_member_pools: Sequence[int], *, demo_sets: int, members: int,
                  non_members: int, trials: int, attacks: int, confidence: float, tolerance: float) -> AuditDesign:
    """`design` of Tang et al.'s DP audit (`dpcore.audit.procedures.dp_audit`): `demo_sets` demo sets, each of one label
    (cycling over the labels whose pools hold a trial), each `trials` trials of that label's pools. Labels are
    taken smallest pools first, so the figure holds whichever order the audit draws."""
    usable = sorted((min(m // members, n // non_members), m, n) for m, n in
                    zip(member_pools, non_member_pools, strict=True) if m >= members and n >= non_members)
    independent, scored = 0, 0
    for position, (_, m, n) in enumerate(usable[:demo_sets]):
        uses = len(range(position, demo_sets, len(usable)))
        independent += _fillable(m, n, members, non_members, trials * uses)
        scored += uses * _scored(m, n, members, non_members, trials)  # each demo set scores against its own prompt
    return design(independent, members=members, non_members=non_members, trials=trials * demo_sets,
                  attacks=attacks, confidence=confidence, tolerance=tolerance, scored=scored)


def _scored(member_pool: int, non_member_pool: int, members: int, non_members: int, trials: int) -> int:
    """Distinct records the trials of one prompt draw (each scored once against it)."""
    return min(trials * members, member_pool) + min(trials * non_members, non_member_pool)


def _fillable(member_pool: int, non_member_pool: int, members: int, non_members: int, trials: int) -> int:
    if members > member_pool or non_members > non_member_pool:
        return 0
    return max(1, min(trials, member_pool // members, non_member_pool // non_members))


def cheapest(planner: Callable[[int, int, int], AuditDesign], member_cap: int, non_member_cap: int,
             max_trials: int = MAX_TRIALS) -> AuditDesign:
    """Of the designs `planner(members, non_members, trials)` (as many non-members per trial as members, or
    2, 4 or 8 times as many), the one that concludes with probability >= `TARGET_PROBABILITY` scoring the
    fewest records; when none can, the one with the narrowest interval."""
    best, narrowest = None, None
    for members in range(1, max(1, member_cap) + 1):
        for ratio in (1, 2, 4, 8):
            if members * ratio > max(1, non_member_cap):
                break
            for trials in range(2, max_trials + 1):
                candidate = planner(members, members * ratio, trials)
                if candidate.conclusive:
                    if best is None or candidate.scored_records < best.scored_records:
                        best = candidate
                    break  # more trials at these sizes only cost more
                if narrowest is None or candidate.half_width < narrowest.half_width:
                    narrowest = candidate
                if candidate.independent_trials < min(trials, max_trials):
                    break  # the pools are full: more trials re-score the same records
    return best if best is not None else narrowest if narrowest is not None else planner(1, 1, 2)


@functools.lru_cache(maxsize=1024)  # pure in public sizes; a run asks the same ones per method
def cheapest_conclusive(member_pool: int, non_member_pool: int, *, attacks: int, confidence: float,
                        tolerance: float, max_trials: int = MAX_TRIALS) -> AuditDesign:
    """`cheapest` over `plan`'s designs for one member pool and one non-member pool."""
    return cheapest(lambda m, k, t: plan(member_pool, non_member_pool, members=m, non_members=k, trials=t,
                                         attacks=attacks, confidence=confidence, tolerance=tolerance),
                    member_pool, non_member_pool, max_trials)


@functools.lru_cache(maxsize=1024)  # pure in public sizes; a run asks the same ones per method
def pool_needed(*, attacks: int, confidence: float, tolerance: float) -> int:
    """The smallest pool size (on each side) for which some design concludes (`cheapest_conclusive`)."""
    low, high = 2, 4
    while not cheapest_conclusive(high, high, attacks=attacks, confidence=confidence, tolerance=tolerance).conclusive:
        low, high = high, high * 2
        if high > 1_000_000:
            raise ConfigError(f"{flag('auc_tolerance')}: {tolerance} is too narrow for any audit")
    while high - low > max(1, low // 50):  # within 2%
        middle = (low + high) // 2
        if cheapest_conclusive(middle, middle, attacks=attacks, confidence=confidence,
                               tolerance=tolerance).conclusive:
            high = middle
        else:
            low = middle
    return high


@functools.lru_cache(maxsize=1024)  # pure in public sizes; a run asks the same ones per method
def tolerance_reachable(member_pool: int, non_member_pool: int, *, attacks: int, confidence: float) -> float:
    """The narrowest band 0.5 +/- tolerance (to 0.01) in which these pools can conclude."""
    for hundredths in range(1, 50):
        tolerance = hundredths / 100
        if cheapest_conclusive(member_pool, non_member_pool, attacks=attacks, confidence=confidence,
                               tolerance=tolerance).conclusive:
            return tolerance
    return 0.5


# `cannot_conclude`'s line: a design and what it can tell, all functions of the pools' sizes, which the callers
# give as public counts (|D|, |D_y|, the configuration; for PromptDPSGD the expected number of records drawn)
declare_line(Kind.COUNT, r"the membership audit would not conclude within AUC 0\.5 \+/- \S+: the best design these "
                         r"pools allow \((\d+)\+(\d+) records x (\d+) trials\) has (no interval|an interval of \+/- "
                         r"\S+) and concludes with probability about (\d+)% even when nothing leaks, because (.*) fall "
                         r"short of the about \d+ per side a conclusive audit needs; add records, or audit the band "
                         r"they can tell \(\S+ (\S+)\)")


def cannot_conclude(chosen: AuditDesign, member_pool: int, non_member_pool: int, *, members_are: str,
                    non_members_are: str, tolerance_flag: str = "--auc-tolerance") -> str | None:
    """One line when an audit of this design will most likely not conclude even if nothing leaks
    (probability below `MIN_PROBABILITY`): which pool falls short and what would do; None otherwise."""
    if chosen.conclusive_probability >= MIN_PROBABILITY:
        return None
    needed = pool_needed(attacks=chosen.attacks, confidence=chosen.confidence, tolerance=chosen.tolerance)
    short = [f"{what} ({size})" for what, size in ((members_are, member_pool), (non_members_are, non_member_pool))
             if size < needed] or [f"{members_are} ({member_pool}) and {non_members_are} ({non_member_pool})"]
    reach = tolerance_reachable(member_pool, non_member_pool, attacks=chosen.attacks, confidence=chosen.confidence)
    width = "no interval" if not math.isfinite(chosen.half_width) else f"an interval of +/- {chosen.half_width:.3f}"
    return (f"the membership audit would not conclude within AUC 0.5 +/- {chosen.tolerance:g}: the best design "
            f"these pools allow ({chosen.members}+{chosen.non_members} records x {chosen.trials} trials) has {width} "
            f"and concludes with probability about {100 * chosen.conclusive_probability:.0f}% even when nothing "
            f"leaks, because {' and '.join(short)} fall short of the about {needed} per side a conclusive audit "
            f"needs; add records, or audit the band they can tell ({tolerance_flag} {reach:g})")
