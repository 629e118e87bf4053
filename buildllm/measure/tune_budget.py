"""`buildllm tune`'s time budget: each part's share of `tune.seconds`, and its paired turns within it
(A B A B, measure/stats.py interleave) until that share is spent, at least MIN_ROUNDS once started."""

from __future__ import annotations

from buildllm.measure.stats import interleave

# Each part's share of the budget (torch.compile gets what is left), and the fewest rounds a part
# runs once started: 6 pairs are the fewest for a 95% interval of a median.
SHARES = {"precision": 0.45, "threads": 0.10, "loss_chunk": 0.05, "attention": 0.03}
MIN_ROUNDS, MAX_ROUNDS = 6, 40
TURN_SECONDS = 0.3  # a turn runs enough steps to last about this long (a single step is noisier)
NO_TIME = "no time left in tune.seconds"


class Budget:
    def __init__(self, seconds: float, clock):
        self.seconds, self.clock = seconds, clock
        self.start = clock()
        self.end = self.start + seconds

    def left(self) -> float:
        return self.end - self.clock()

    def take_turns(
        self, name: str, turns: dict, skipped: list, warmup: int = 1, rounds: int = MAX_ROUNDS
    ) -> dict | None:
        """Each side's seconds, round by round (the first side is the reference), within part `name`'s
        share; None, and said in `skipped`, when not even one round fitted."""
        seconds = interleave(
            turns,
            warmup=warmup,
            rounds=rounds,
            soft_deadline=min(self.end, self.clock() + SHARES[name] * self.seconds),
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
