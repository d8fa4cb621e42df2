"""What one step did (StepRecord) and what a run added up to (RunStats): plain Python.

These are what the chapters plot, the live demo draws and the Prometheus
exporter (lab/metrics.py) counts.
"""
from dataclasses import dataclass, field


@dataclass
class StepRecord:
    step: int
    k: int  # tokens drafted this step (0 means a plain target step)
    drafted: list  # the drafted ids d_1..d_k, accepted ones first: drafted[:num_accepted] (a tree: its path)
    num_accepted: int
    next_token: int  # the correction (a rejection) or bonus (all accepted) token
    p_draft: list  # p_i(d_i), the target's probability of each drafted token
    q_draft: list  # q_i(d_i), the draft's probability of each drafted token
    uniforms: list  # u_i drawn for each acceptance test (empty when greedy)
    draft_seconds: float
    target_seconds: float
    syncs: int  # host synchronisations this step
    committed: list = field(default_factory=list)  # tokens this step added to the output

    @property
    def bonus(self) -> bool:
        return self.k > 0 and self.num_accepted == self.k


@dataclass
class RunStats:
    new_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # wall time of the decode loop, prefill excluded
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    syncs: int = 0
    accepted_per_position: list = field(default_factory=list)  # [i] = drafts whose token i was accepted
    drafts: int = 0  # steps that drafted at least one token (k > 0); vLLM's num_drafts

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def accepted_share(self) -> float:
        """Accepted / drafted tokens over the run. Not alpha = E[min(1, p/q)] (arXiv 2211.17192):
        position i is tested only when positions 1..i-1 were accepted, so the share falls as K grows."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def syncs_per_step(self) -> float:
        return self.syncs / self.steps if self.steps else 0.0

    def add_step(self, rec: StepRecord, new_tokens: int):
        self.steps += 1
        self.drafts += int(rec.k > 0)
        self.new_tokens += new_tokens
        self.drafted += rec.k
        self.accepted += rec.num_accepted
        self.draft_seconds += rec.draft_seconds
        self.target_seconds += rec.target_seconds
        self.syncs += rec.syncs
        self.accepted_per_position += [0] * (rec.k - len(self.accepted_per_position))
        for i in range(rec.num_accepted):
            self.accepted_per_position[i] += 1

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("tokens_per_second", "mean_tokens_per_step", "accepted_share", "syncs_per_step"):
            out[k] = getattr(self, k)
        return out
