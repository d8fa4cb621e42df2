"""A running estimate that forgets: what the adaptive-K controllers and the metrics exporter read."""


class MovingRatio:
    """An exponentially weighted ratio: decayed sum of numerators over decayed sum of denominators.

    After updates (a_1, b_1) .. (a_t, b_t): value = sum_i decay^(t-i) a_i / sum_i decay^(t-i) b_i.
    decay = 1 gives the plain cumulative ratio; smaller decays forget faster (an
    update's weight halves after log(0.5)/log(decay) further updates). Weighting by
    the denominator means a step that drafted 5 tokens counts five times a step
    that drafted 1, as the cumulative accepted share does.
    """

    def __init__(self, decay: float = 0.9):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
        self.decay = float(decay)
        self.num = 0.0
        self.den = 0.0

    def update(self, num: float, den: float):
        self.num = self.decay * self.num + num
        self.den = self.decay * self.den + den

    @property
    def value(self) -> float | None:
        """The ratio, or None before any denominator was seen."""
        return self.num / self.den if self.den > 0 else None
