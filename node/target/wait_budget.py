"""The wait budget of one job's draft rounds: when waiting for drafters stops paying, the job decodes
alone (mixed into ``node.target.rounds.MarketProposer``; TargetConfig.wait_budget sets the share)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

MIN_BUDGET_ROUNDS = 1  # rounds of evidence before the budget can stop a job's drafting


class WaitBudget:
    """Mixed into ``MarketProposer``: reads its ``wait_budget``, ``rounds``, ``started``, ``wasted_s``,
    ``wait_s``, ``deadline_s``, ``passes`` and ``job``, and sets ``stopped_at``."""

    def _over_budget(self, now: float, k: int) -> bool | None:
        """Should the job stop asking for drafts, for good (True)? Either wasted waiting (in rounds
        whose draft gave no accepted token) has cost more than the allowance, half a deadline plus
        WAIT_BUDGET_SHARE of the job's time, while the job runs slower than plain decoding would;
        or the job runs slower than plain decoding by more than the allowance, whatever the drafts
        bought (accepted drafts that paid for less than their waiting, on a loaded machine).

        Plain decoding's time for the k tokens emitted so far is the prefill plus k one-position
        passes: this job's own measured pass, else the engine's latest measurement (``TimedModel``).
        Without either, this round is decoded alone to measure one (never costlier than plain
        decoding). So a drafter that answers every round with nothing just before the deadline, or
        one that paces correct drafts there (never wasteful, yet slower than plain decoding: no
        round alone ever measured a plain pass), costs about one deadline and this share."""
        if not self.wait_budget or self.rounds < MIN_BUDGET_ROUNDS or self.passes is None:
            return False
        elapsed = now - self.started
        allowance = self.wait_budget * elapsed + self.deadline_s / 2  # a share, and half a round of trial
        wasteful = self.wasted_s > allowance
        plain_s = self._plain_seconds(k)
        if plain_s is None:
            return None  # probe: one round alone measures a plain pass
        if elapsed <= plain_s or not (wasteful or elapsed - plain_s > allowance):
            return False
        self.stopped_at = self.rounds
        log.info(
            "job %s: %d tokens took %.3f s with drafts (%.3f s of waiting); plain decoding would take about "
            "%.3f s: decoding alone from round %d",
            self.job, k, elapsed, self.wait_s, plain_s, self.rounds,
        )  # fmt: skip
        return True

    def _plain_seconds(self, tokens: int) -> float | None:
        """What plain decoding takes for ``tokens`` tokens of this job: its prefill plus one measured
        one-position pass per token (None before such a pass was measured)."""
        plain_pass_s = self.passes.plain_pass_s() if self.passes is not None else None
        if plain_pass_s is None:
            return None
        return self.passes.pass_seconds[0] + plain_pass_s * tokens
