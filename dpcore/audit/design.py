"""Planning a membership audit before it runs: can it tell, and at what size.

Every attack's interval of the mean per-trial AUC (`audit_statistics.auc_mean_ci`: Student-t over the
independent trials, per-trial variance floored at the Hanley-McNeil no-leak variance, Bonferroni over the
attacks) is known in distribution before a single record is scored: it depends only on the sizes and on
the AUC the attacks reach. With m members and k non-members per trial and n independent trials,

    half-width = t_{1 - a/2}(n - 1) * sqrt(max(s^2, v0) / n),   v0 = (m + k + 1) / (12 m k),
    a = (1 - confidence) / attacks,

where s^2 is the trials' sample variance, and n is at most the trials asked and what each pool can fill
disjointly (pool // per trial): a small pool caps m * n, so no number of trials helps past it.

Two gates (`AuditConfig.test`, `dpcore.audit.gate`):

- detect (the default): the gate fails when some attack's interval excludes 0.5. When nothing leaks
  each interval covers 0.5 with probability >= 1 - a, so the gate's false-alarm rate is <= 1 - confidence
  (a union bound over the attacks). Its power against a leak of size A (`leak_auc`: an attack whose
  per-trial AUC has mean A) uses the Hanley-McNeil variance at A,

      V(A) = (A (1 - A) + (m - 1) (Q1 - A^2) + (k - 1) (Q2 - A^2)) / (m k),   Q1 = A / (2 - A),
      Q2 = 2 A^2 / (1 + A),

  the mean of the n AUCs as N(A, V(A) / n) and s^2 as V(A) chi^2(n - 1) / (n - 1) (independent of the
  mean), so that

      power = E_{s^2}[ Phi((A - 1/2 - h) / sd) + Phi((1/2 - A - h) / sd) ],   sd = sqrt(V(A) / n),

  h the half-width above: the interval's actual construction, one attack at the family-wise level (a
  lower bound when several attacks reach A). The design sized for the audit is the one scoring the
  fewest records with power >= `power` (`AuditConfig.power`, default 0.95), checked against simulated
  audits in `tests/test_audit_design.py`: tens of records per side, where the band needs thousands.
- equivalence: the gate passes only when every interval lies inside 0.5 +/- tolerance. When nothing
  leaks each attack's mean AUC is about N(0.5, v0 / n), so the audit concludes with probability

      P >= 1 - attacks * 2 * (1 - Phi((tolerance - half-width) / sqrt(v0 / n)))

  (a union bound over the attacks), and the design is the cheapest with P >= `TARGET_PROBABILITY`.

`plan` (one pool on each side: a released prompt's audit) and `plan_by_label` (Tang et al.'s per-label
demo sets) give a design and what it can tell; `cheapest` the design with the fewest scored records that
reaches its aim (or, when none can, the strongest); `pool_needed` the smallest pool on each side for which
one exists; `tolerance_reachable` / `leak_reachable` the band or the leak the pools can support;
`cannot_conclude` the one line said before any scoring when no design reaches its aim.

Only sizes go in: pool sizes, trials, members per trial. The pools' sizes are counts of the private
split and of the records a mechanism read (set by the public plan and the sampler), never of what a
record says.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import special, stats

from dpcore.audit.config import AuditConfig
from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.public_outputs import Kind, declare_line

# A no-leak audit should conclude at least this often (equivalence): a release gate that a sound prompt fails
# one time in three is a gate users learn to bypass.
TARGET_PROBABILITY = 0.9
# Below this an equivalence audit is not worth its minutes: it is said (and, unless its sizes were asked for,
# skipped).
MIN_PROBABILITY = 0.25
MAX_TRIALS = 50  # past this the t quantile gains nothing a larger per-trial sample would not
# detect: fewer member x non-member pairs per trial make each trial's AUC a coin (1 vs 1: 0 or 1), whose
# t interval's coverage sits at its nominal level with no margin; `cheapest` skips them
MIN_PAIRS = 4
DETECT, EQUIVALENCE = "detect", "equivalence"
_VARIANCE_POINTS = 64  # midpoint quantiles of chi^2(n - 1): the power's expectation over the sample variance


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
    conclusive_probability: float  # P(a verdict | no leak): equivalence, every interval inside the band (a bound)
    scored_records: int = 0  # (record, prompt) pairs scored, each against every attack's prompts: its cost
    test: str = EQUIVALENCE
    leak_auc: float = math.nan  # detect: the leak the design is sized against
    power: float = math.nan  # detect: P(the gate fails | an attack's mean AUC is leak_auc)
    false_alarm: float = math.nan  # detect: P(the gate fails | nothing leaks), <= 1 - confidence
    target_power: float = math.nan  # detect: the power asked (`AuditConfig.power`)

    @property
    def conclusive(self) -> bool:
        """The design reaches its aim: detect, the power asked; equivalence, a verdict with probability
        `TARGET_PROBABILITY` when nothing leaks."""
        if self.test == DETECT:
            return self.power >= self.target_power
        return self.conclusive_probability >= TARGET_PROBABILITY

    @property
    def strength(self) -> float:
        """What `cheapest` maximises when no design reaches the aim: the power, or minus the half-width."""
        return self.power if self.test == DETECT else -self.half_width

    def to_dict(self) -> dict:
        return {**asdict(self), "conclusive": self.conclusive}


def settings(config: AuditConfig, attacks: int) -> dict:
    """The keyword arguments of `plan`, `plan_by_label`, `cheapest_conclusive` and `pool_needed` that an
    audit configuration sets (its test, confidence, band, leak and power) for `attacks` attacks."""
    return dict(attacks=attacks, confidence=config.confidence, tolerance=config.auc_tolerance, test=config.test,
                leak_auc=config.leak_auc, power=config.power)


def null_variance(members: int, non_members: int) -> float:
    """Hanley-McNeil variance of one trial's AUC when nothing leaks (as `audit_statistics` floors it)."""
    return (members + non_members + 1) / (12.0 * members * non_members)


def leak_variance(auc: float, members: int, non_members: int) -> float:
    """Hanley-McNeil (1982) variance of one trial's AUC of `members` vs `non_members` scores at AUC `auc`
    (Q1 = A / (2 - A), Q2 = 2 A^2 / (1 + A)); `null_variance` at 0.5."""
    q1, q2, square = auc / (2.0 - auc), 2.0 * auc * auc / (1.0 + auc), auc * auc
    return (auc * (1.0 - auc) + (members - 1) * (q1 - square) + (non_members - 1) * (q2 - square)) / (
        members * non_members)


@functools.lru_cache(maxsize=4096)
def _t_quantile(confidence: float, attacks: int, dof: int) -> float:
    level = 1.0 - (1.0 - confidence) / attacks  # Bonferroni over the attacks, as the gate reads them
    return float(stats.t.ppf(0.5 + level / 2, dof))


@functools.lru_cache(maxsize=256)
def _chi2_spread(dof: int) -> np.ndarray:
    """Midpoint quantiles of chi^2(dof) / dof: the sample variance's spread around its mean."""
    points = (np.arange(_VARIANCE_POINTS) + 0.5) / _VARIANCE_POINTS
    return stats.chi2.ppf(points, dof) / dof


def rejection_probability(auc: float, independent: int, members: int, non_members: int, *, attacks: int,
                          confidence: float, lower: bool = True) -> float:
    """P(one attack's interval (`auc_mean_ci` at the family-wise level, over `independent` trials) excludes
    0.5 | its per-trial AUC has mean `auc`): the mean as N(auc, V / n), the sample variance as V chi^2(n - 1) /
    (n - 1), V the Hanley-McNeil variance at `auc`, the interval's variance floored at the no-leak one.

    The mean of n AUCs of m x k pairs lies on a lattice of step 1 / (m k n): half a step more to cross
    (`lower`: a lower bound, as a power is quoted) or less (an upper bound, as a false-alarm rate is)."""
    if independent < 2:
        return 0.0
    v0, variance = null_variance(members, non_members), leak_variance(auc, members, non_members)
    sample = variance * _chi2_spread(independent - 1)
    half = _t_quantile(confidence, attacks, independent - 1) * np.sqrt(np.maximum(sample, v0) / independent)
    half = half + (1 if lower else -1) * 0.5 / (members * non_members * independent)
    spread = math.sqrt(variance / independent)
    shift = auc - 0.5
    return float(np.mean(special.ndtr((shift - half) / spread) + special.ndtr((-shift - half) / spread)))


def design(independent: int, *, members: int, non_members: int, trials: int, attacks: int, confidence: float,
           tolerance: float = 0.05, scored: int = 0, test: str = DETECT, leak_auc: float = 0.75,
           power: float = 0.95) -> AuditDesign:
    """The design of `trials` trials of `members` + `non_members` records, `independent` of them disjoint,
    scoring `scored` (record, prompt) pairs, for the gate `test`."""
    for name, value in (("members", members), ("non_members", non_members), ("trials", trials),
                        ("attacks", attacks)):
        if value < 1:
            raise ConfigError(f"{name}: must be >= 1, got {value}")
    if test not in (DETECT, EQUIVALENCE):
        raise ConfigError(f"test: {test!r} is not {DETECT!r} or {EQUIVALENCE!r}")
    if independent < 2:
        half, probability = math.inf, 0.0
    else:
        spread = math.sqrt(null_variance(members, non_members) / independent)
        half = _t_quantile(confidence, attacks, independent - 1) * spread
        margin = tolerance - half
        tail = 0.5 * math.erfc(margin / spread / math.sqrt(2))  # P(N(0, 1) > margin / spread)
        probability = 0.0 if margin <= 0 else max(0.0, 1.0 - attacks * 2.0 * tail)
    if test == EQUIVALENCE:
        return AuditDesign(members, non_members, trials, independent, attacks, confidence, tolerance, half,
                           probability, scored)
    sizes = dict(attacks=attacks, confidence=confidence)
    detected = rejection_probability(leak_auc, independent, members, non_members, **sizes)
    alarm = min(1.0 - confidence,
                attacks * rejection_probability(0.5, independent, members, non_members, lower=False, **sizes))
    return AuditDesign(members, non_members, trials, independent, attacks, confidence, tolerance, half,
                       1.0 if independent >= 2 else 0.0, scored, DETECT, leak_auc, detected, alarm, power)


def plan(member_pool: int, non_member_pool: int, *, members: int, non_members: int, trials: int,
         **test) -> AuditDesign:
    """`design` of trials drawn from one member pool and one non-member pool (a released prompt's audit:
    `dpcore.audit.procedures.prompt_audit`); `test`: `design`'s attacks, confidence and gate settings."""
    return design(_fillable(member_pool, non_member_pool, members, non_members, trials), members=members,
                  non_members=non_members, trials=trials,
                  scored=_scored(member_pool, non_member_pool, members, non_members, trials), **test)


def plan_by_label(member_pools: Sequence[int], non_member_pools: Sequence[int], *, demo_sets: int, members: int,
                  non_members: int, trials: int, **test) -> AuditDesign:
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
                  scored=scored, **test)


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
    2, 4 or 8 times as many), the one that reaches its aim (`AuditDesign.conclusive`) scoring the fewest
    records; when none can, the strongest (`AuditDesign.strength`: the most powerful, or the narrowest)."""
    best, strongest = None, None
    for members in range(1, max(1, member_cap) + 1):
        if best is not None and planner(members, members, 2).scored_records >= best.scored_records:
            break  # every design with more members per trial scores more records
        for ratio in (1, 2, 4, 8):
            if members * ratio > max(1, non_member_cap):
                break
            for trials in range(2, max_trials + 1):
                candidate = planner(members, members * ratio, trials)
                if candidate.test == DETECT and members * members * ratio < MIN_PAIRS:
                    break
                if best is not None and candidate.scored_records >= best.scored_records:
                    break  # more trials at these sizes only cost more
                if candidate.conclusive:
                    best = candidate
                    break
                if strongest is None or candidate.strength > strongest.strength:
                    strongest = candidate
                if candidate.independent_trials < min(trials, max_trials):
                    break  # the pools are full: more trials re-score the same records
    return best if best is not None else strongest if strongest is not None else planner(1, 1, 2)


@functools.lru_cache(maxsize=1024)  # pure in public sizes; a run asks the same ones per method
def cheapest_conclusive(member_pool: int, non_member_pool: int, *, max_trials: int = MAX_TRIALS,
                        **test) -> AuditDesign:
    """`cheapest` over `plan`'s designs for one member pool and one non-member pool."""
    return cheapest(lambda m, k, t: plan(member_pool, non_member_pool, members=m, non_members=k, trials=t, **test),
                    member_pool, non_member_pool, max_trials)


@functools.lru_cache(maxsize=1024)  # pure in public sizes; a run asks the same ones per method
def pool_needed(**test) -> int:
    """The smallest pool size (on each side) for which some design reaches its aim (`cheapest_conclusive`)."""
    low, high = 2, 4
    while not cheapest_conclusive(high, high, **test).conclusive:
        low, high = high, high * 2
        if high > 1_000_000:
            what = (f"{flag('leak_auc')}: {test.get('leak_auc')}" if test.get("test", DETECT) == DETECT
                    else f"{flag('auc_tolerance')}: {test.get('tolerance')}")
            raise ConfigError(f"{what} is too small for any audit")
    while high - low > max(1, low // 50):  # within 2%
        middle = (low + high) // 2
        if cheapest_conclusive(middle, middle, **test).conclusive:
            high = middle
        else:
            low = middle
    return high


@functools.lru_cache(maxsize=1024)  # pure in public sizes; a run asks the same ones per method
def tolerance_reachable(member_pool: int, non_member_pool: int, *, attacks: int, confidence: float) -> float:
    """The narrowest band 0.5 +/- tolerance (to 0.01) in which these pools can conclude (equivalence)."""
    for hundredths in range(1, 50):
        tolerance = hundredths / 100
        if cheapest_conclusive(member_pool, non_member_pool, attacks=attacks, confidence=confidence,
                               tolerance=tolerance, test=EQUIVALENCE).conclusive:
            return tolerance
    return 0.5


@functools.lru_cache(maxsize=1024)  # pure in public sizes; a run asks the same ones per method
def leak_reachable(member_pool: int, non_member_pool: int, *, attacks: int, confidence: float,
                   power: float) -> float | None:
    """The smallest leak (mean AUC, to 0.01) these pools detect with `power` (detect); None when not even
    0.99 is."""
    def reached(hundredths: int) -> bool:
        return cheapest_conclusive(member_pool, non_member_pool, attacks=attacks, confidence=confidence,
                                   test=DETECT, leak_auc=hundredths / 100, power=power).conclusive
    low, high = 50, 99  # reached(high) unless None; never reached at 0.5
    if not reached(high):
        return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reached(middle) else (middle, high)
    return high / 100


# `cannot_conclude`'s lines: a design and what it can tell, all functions of the pools' sizes, which the callers
# give as public counts (|D|, |D_y|, the configuration; for PromptDPSGD the expected number of records drawn)
declare_line(Kind.COUNT, r"the membership audit would not conclude within AUC 0\.5 \+/- \S+: the best design these "
                         r"pools allow \((\d+)\+(\d+) records x (\d+) trials\) has (no interval|an interval of \+/- "
                         r"\S+) and concludes with probability about (\d+)% even when nothing leaks, because (.*) fall "
                         r"short of the about \d+ per side a conclusive audit needs; add records, or audit the band "
                         r"they can tell \(\S+ (\S+)\)")
declare_line(Kind.COUNT, r"the membership audit cannot detect a leak of AUC \S+ with power \S+: the best design these "
                         r"pools allow \((\d+)\+(\d+) records x (\d+) trials\) detects it with probability about "
                         r"(\d+)%, because (.*) fall short of the about (\d+) per side it needs; add records, or "
                         r"(.*)$")


def cannot_conclude(chosen: AuditDesign, member_pool: int, non_member_pool: int, *, members_are: str,
                    non_members_are: str, tolerance_flag: str = "--auc-tolerance", leak_flag: str = "--leak-auc",
                    power_flag: str = "--audit-power", fewer_attacks: str = "--audit-reference-prompts 0"
                    ) -> str | None:
    """One line, said before any scoring, when this design falls short of its aim: detect, its power is
    below the power asked; equivalence, it most likely will not conclude even if nothing leaks (probability
    below `MIN_PROBABILITY`). It names the pool that falls short, the pool size that would do and the
    setting the pools support (a larger `--leak-auc`, fewer attacks, a lower power, or a wider band);
    None otherwise."""
    if chosen.test == DETECT:
        if chosen.conclusive:
            return None
        test = dict(attacks=chosen.attacks, confidence=chosen.confidence, test=DETECT, leak_auc=chosen.leak_auc,
                    power=chosen.target_power)
    else:
        if chosen.conclusive_probability >= MIN_PROBABILITY:
            return None
        test = dict(attacks=chosen.attacks, confidence=chosen.confidence, tolerance=chosen.tolerance,
                    test=EQUIVALENCE)
    needed = pool_needed(**test)
    short = [f"{what} ({size})" for what, size in ((members_are, member_pool), (non_members_are, non_member_pool))
             if size < needed] or [f"{members_are} ({member_pool}) and {non_members_are} ({non_member_pool})"]
    sizes = f"({chosen.members}+{chosen.non_members} records x {chosen.trials} trials)"
    if chosen.test == DETECT:
        options = []
        reach = leak_reachable(member_pool, non_member_pool, attacks=chosen.attacks, confidence=chosen.confidence,
                               power=chosen.target_power)
        if reach is not None:
            options.append(f"audit the leak they can detect ({leak_flag} {reach:g})")
        if chosen.attacks > 3 and cheapest_conclusive(member_pool, non_member_pool,
                                                      **{**test, "attacks": 3}).conclusive:
            options.append(f"run the three calibrated attacks only ({fewer_attacks})")
        options.append(f"accept less power ({power_flag} {max(0.5, math.floor(100 * chosen.power) / 100):g})")
        return (f"the membership audit cannot detect a leak of AUC {chosen.leak_auc:g} with power "
                f"{chosen.target_power:g}: the best design these pools allow {sizes} detects it with probability "
                f"about {100 * chosen.power:.0f}%, because {' and '.join(short)} fall short of the about {needed} "
                f"per side it needs; add records, or {', or '.join(options)}")
    reach = tolerance_reachable(member_pool, non_member_pool, attacks=chosen.attacks, confidence=chosen.confidence)
    width = "no interval" if not math.isfinite(chosen.half_width) else f"an interval of +/- {chosen.half_width:.3f}"
    return (f"the membership audit would not conclude within AUC 0.5 +/- {chosen.tolerance:g}: the best design "
            f"these pools allow {sizes} has {width} "
            f"and concludes with probability about {100 * chosen.conclusive_probability:.0f}% even when nothing "
            f"leaks, because {' and '.join(short)} fall short of the about {needed} per side a conclusive audit "
            f"needs; add records, or audit the band they can tell ({tolerance_flag} {reach:g})")


def shortfall_note(chosen: AuditDesign) -> str | None:
    """One line when a design that `cannot_conclude` lets run still falls short of its aim (equivalence:
    concluding with probability `TARGET_PROBABILITY`); None when it reaches it."""
    if chosen.conclusive:
        return None
    if chosen.test == DETECT:
        return (f"audit design {chosen.members}+{chosen.non_members} records x {chosen.trials} trials detects a leak "
                f"of AUC {chosen.leak_auc:g} with probability about {100 * chosen.power:.0f}%")
    return (f"audit design {chosen.members}+{chosen.non_members} records x {chosen.trials} trials concludes with "
            f"probability about {100 * chosen.conclusive_probability:.0f}% when nothing leaks")
