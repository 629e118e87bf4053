"""`buildllm tune`'s time budget: each part's share of `tune.seconds`, and its paired turns within it
(A B A B, measure/stats.py interleave) until that share is spent, at least MIN_ROUNDS once started."""

from __future__ import annotations

from buildllm.measure.stats import interleave

# The fewest rounds a part runs once started: 6 pairs are the fewest for a 95% interval of a median.
# (Each part's share of the budget depends on the device: measure/tune_order.py.)
MIN_ROUNDS, MAX_ROUNDS = 6, 40
TURN_SECONDS = 0.3  # a turn runs enough steps to last about this long (a single step is noisier)
NO_TIME = "no time left in tune.seconds"


class Budget:
    def __init__(self, seconds: float, clock, shares: dict[str, float]):
        self.seconds, self.clock, self.shares = seconds, clock, shares
        self.start = clock()
        self.end = self.start + seconds

    def left(self) -> float:
        return self.end - self.clock()

    def take_turns(
        self, name: str, turns: dict, skipped: list, warmup: int = 1, rounds: int = MAX_ROUNDS, part: float = 1.0
    ) -> dict | None:
        """Each side's seconds, round by round (the first side is the reference), within `part` of part
        `name`'s share (a part measured once per precision splits it); None, and said in `skipped`, when
        not even one round fitted."""
        seconds = interleave(
            turns,
            warmup=warmup,
            rounds=rounds,
            soft_deadline=min(self.end, self.clock() + self.shares[name] * part * self.seconds),
            hard_deadline=self.end,
            min_rounds=MIN_ROUNDS,
            clock=self.clock,
        )
        if not seconds[next(iter(turns))]:
            skipped.append(f"{name.replace('_', ' ')}: {NO_TIME}")
            return None
        return seconds


def steps_per_turn(step, clock) -> int:
    begin = clock()
    step()
    return max(1, min(8, round(TURN_SECONDS / max(clock() - begin, 1e-6))))
