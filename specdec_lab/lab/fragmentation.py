"""Why paging exists, simulated: reserved vs used KV memory and how many requests fit.

`simulate_fragmentation` runs one workload of requests through a contiguous design
(each request reserves its maximum length up front) and a paged one (blocks of P
tokens taken as a sequence grows, and speculative lookahead rolled back).

A step is not a unit of time: one that verifies 60 requests reads 60 caches and does 60
times the work of one that verifies one. Each step is therefore also priced by the
roofline (analysis/roofline.py) on a stated model and device: the weights read once, the
KV slots the step's attention reads, and the FLOPs of its prefill and K+1 verification
tokens, whichever is slower. The designs are compared in modelled seconds, not steps.
"""
import math
import random
from dataclasses import dataclass, field

from ..analysis import roofline as rf
from ..core.config import ModelConfig
from ..paged.allocator import BlockAllocator, _check_int, blocks_for


@dataclass
class Request:
    arrival: int  # step at which the request arrives
    prompt_len: int  # positions written by its prefill
    max_new_tokens: int  # the cap it declares: a contiguous cache reserves for it up front
    increments: list[int]  # positions each speculative step commits (a + 1), until its output ends


@dataclass
class DesignTrace:
    """One design's run of the workload. Series hold one value per engine step,
    taken at the step's peak: after the K+1 lookahead is written, before rollback."""
    design: str  # "contiguous" or "paged"
    reserved: list[int] = field(default_factory=list)  # KV slots held by running requests
    used: list[int] = field(default_factory=list)  # KV slots holding keys that this step's attention reads
    running: list[int] = field(default_factory=list)  # requests in the batch
    waiting: list[int] = field(default_factory=list)  # requests that arrived and wait for memory
    preemptions: int = 0  # paged only: requests evicted (and later recomputed) when a block was missing
    utilisation: float = 0.0  # sum(used) / sum(reserved) over the run
    mean_concurrent: float = 0.0  # mean of `running` over the steps where requests were waiting
    max_concurrent: int = 0
    steps: int = 0  # engine steps until the last request finished
    step_seconds: list[float] = field(default_factory=list)  # each step priced by the roofline (StepCost)
    seconds: float = 0.0  # modelled time until the last request finished: sum(step_seconds)
    tokens: int = 0  # tokens generated over the run (the same workload for both designs)

    @property
    def tokens_per_second(self) -> float:
        """Throughput in modelled time: what the server delivers, where `steps` would flatter
        the design that packs more requests into each step."""
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class StepCost:
    """Prices one engine step with the roofline: a forward that reads the weights once and
    `kv_slots` cached positions, and computes `tokens` new tokens attending over them."""
    model: ModelConfig = field(default_factory=lambda: rf.LLAMA_3_8B)  # the served model's shape
    hardware: str = "H200"  # a key of roofline.HARDWARE
    bytes_per_param: float = 2.0  # bf16 weights and cache

    def seconds(self, tokens: int, kv_slots: int) -> float:
        hw = rf.HARDWARE[self.hardware]
        moved = rf.bytes_per_token(self.model, 0, self.bytes_per_param) + \
            kv_slots * rf.kv_bytes_per_position(self.model, self.bytes_per_param)
        cfg = self.model
        work = tokens * rf.flops_per_token(cfg) + 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * kv_slots
        return max(moved / hw.bandwidth, work / hw.peak_flops)


@dataclass
class FragmentationResult:
    params: dict  # the arguments of simulate_fragmentation
    contiguous: DesignTrace
    paged: DesignTrace

    def summary(self) -> dict:
        keys = ("utilisation", "mean_concurrent", "max_concurrent", "steps", "preemptions", "seconds",
                "tokens_per_second")
        return {d.design: {k: getattr(d, k) for k in keys} for d in (self.contiguous, self.paged)}


def make_workload(num_requests, max_len, k, acceptance, arrival_rate, seed) -> list[Request]:
    """Requests with log-normal prompts (median 256), a declared cap of 128..1024 new
    tokens, and an actual output that ends before the cap (end of sequence). Each step
    accepts a ~ truncated Geometric(acceptance) draft tokens and commits a + 1."""
    rng = random.Random(seed)
    t, requests = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(arrival_rate)
        prompt = min(max(int(rng.lognormvariate(math.log(256), 0.8)), 8), max_len // 2)
        cap = min(rng.choice([128, 256, 512, 1024]), max_len - prompt - (k + 1))
        out = max(1, round(cap * rng.betavariate(1.5, 2.0)))
        increments, done = [], 0
        while done < out:
            a = 0
            while a < k and rng.random() < acceptance:
                a += 1
            increments.append(min(a + 1, out - done))
            done += increments[-1]
        requests.append(Request(int(t), prompt, cap, increments))
    return requests


@dataclass(eq=False)
class _Active:
    i: int  # request index
    length: int  # committed positions
    step: int  # speculative steps done
    held: object  # contiguous: reserved slots (int); paged: block ids (list)
    fresh: bool = True  # prefilled this step, decodes from the next


class _ContiguousMemory:
    """Each admitted request reserves prompt + max_new_tokens + K + 1 slots at once."""

    def __init__(self, memory_tokens, block_size, k):
        self.total, self.free, self.k = memory_tokens, memory_tokens, k

    def admit(self, i, req, length):
        need = req.prompt_len + req.max_new_tokens + self.k + 1
        if need > self.free:
            return None
        self.free -= need
        return _Active(i, length, 0, need)

    def grow(self, r, length):  # the reservation already covers every length
        return True

    def shrink(self, r):
        pass

    def release(self, r):
        self.free += r.held

    @property
    def reserved(self):
        return self.total - self.free


class _PagedMemory:
    """Requests hold ceil(length / P) blocks, one more when a write crosses a boundary."""

    def __init__(self, memory_tokens, block_size, k):
        self.alloc, self.P, self.k = BlockAllocator(max(memory_tokens // block_size, 1)), block_size, k

    def admit(self, i, req, length):
        if blocks_for(length + self.k + 1, self.P) > self.alloc.num_free:
            return None  # the prompt and its first lookahead must fit
        return _Active(i, length, 0, self.alloc.allocate(blocks_for(length, self.P)))

    def grow(self, r, length):
        need = blocks_for(length, self.P) - len(r.held)
        if need > self.alloc.num_free:
            return False
        r.held += self.alloc.allocate(max(need, 0))
        return True

    def shrink(self, r):  # rollback: free whole blocks beyond the committed length
        keep = blocks_for(r.length, self.P)
        self.alloc.free(r.held[keep:])
        del r.held[keep:]

    def release(self, r):
        self.alloc.free(r.held)

    @property
    def reserved(self):
        return self.alloc.num_used * self.P


def _run_design(design, requests, memory_tokens, block_size, k, cost) -> DesignTrace:
    """Serve `requests` first come, first served. Paged memory can run out mid-request:
    then the latest admitted request is evicted and later recomputed (vLLM's policy)."""
    mem = (_PagedMemory if design == "paged" else _ContiguousMemory)(memory_tokens, block_size, k)
    trace = DesignTrace(design)
    pending = sorted(range(len(requests)), key=lambda i: requests[i].arrival)[::-1]  # pop() = next
    waiting, running, progress, t = [], [], {}, 0
    while pending or waiting or running:
        while pending and requests[pending[-1]].arrival <= t:
            waiting.append(pending.pop())
        evicted = False
        for r in list(running):  # decode: write the K+1 lookahead at [length, length + K + 1)
            while r in running and not mem.grow(r, r.length + k + 1):
                victim = running.pop()
                mem.release(victim)
                progress[victim.i] = victim.step
                waiting.insert(0, victim.i)
                trace.preemptions, evicted = trace.preemptions + 1, True
        while waiting and not evicted:  # admit and prefill (evicted requests come back first)
            req = requests[waiting[0]]
            step = progress.get(waiting[0], 0)
            r = mem.admit(waiting[0], req, req.prompt_len + sum(req.increments[:step]))
            if r is None:
                if not running:
                    raise ValueError(f"memory_tokens={memory_tokens} cannot hold request {waiting[0]} "
                                     f"(prompt {req.prompt_len}, max_new_tokens {req.max_new_tokens})")
                break
            r.step = step
            waiting.pop(0)
            running.append(r)
        trace.reserved.append(mem.reserved)
        trace.used.append(sum(r.length + (0 if r.fresh else k + 1) for r in running))
        new_tokens = sum(r.length if r.fresh else k + 1 for r in running)  # prefills, then K+1 per decoder
        trace.step_seconds.append(cost.seconds(new_tokens, trace.used[-1]) if running else 0.0)
        trace.running.append(len(running))
        trace.waiting.append(len(waiting))
        for r in list(running):  # commit a + 1 positions, roll back the rest
            if r.fresh:
                r.fresh = False
                continue
            r.length += requests[r.i].increments[r.step]
            trace.tokens += requests[r.i].increments[r.step]
            r.step += 1
            if r.step == len(requests[r.i].increments):
                running.remove(r)
                mem.release(r)
            else:
                mem.shrink(r)
        t += 1
    return _summarise(trace)


def _summarise(trace: DesignTrace) -> DesignTrace:
    busy = [n for n, w in zip(trace.running, trace.waiting) if w > 0] or trace.running
    trace.utilisation = sum(trace.used) / max(sum(trace.reserved), 1)
    trace.mean_concurrent = sum(busy) / len(busy)
    trace.max_concurrent = max(trace.running)
    trace.steps = len(trace.running)
    trace.seconds = math.fsum(trace.step_seconds)
    return trace


def simulate_fragmentation(num_requests=200, max_len=2048, block_size=16, memory_tokens=32768,
                           seed=0, k=4, acceptance=0.7, arrival_rate=4.0, cost=StepCost()) -> FragmentationResult:
    """Serve one simulated workload twice in `memory_tokens` KV slots: with a contiguous
    cache (each request reserves its maximum length when admitted) and with a paged one
    (blocks of `block_size` taken as it grows, whole blocks freed on rollback). Every
    step writes K+1 lookahead positions and keeps a + 1 of them, a ~ Geometric(acceptance)
    truncated at K. `arrival_rate` is requests per step; the default floods the server,
    so memory, not arrivals, bounds how many requests run at once. `cost` prices each step
    (a Llama-3-8B-shaped model in bf16 on an H200 by default). Seeded and deterministic."""
    for name, v, low in [("num_requests", num_requests, 1), ("max_len", max_len, 64),
                         ("block_size", block_size, 1), ("memory_tokens", memory_tokens, 1), ("k", k, 1)]:
        _check_int(name, v, low)
    if k > max_len // 4:
        raise ValueError(f"k must be <= max_len // 4 = {max_len // 4}, got {k}")
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance!r}")
    if not arrival_rate > 0:
        raise ValueError(f"arrival_rate must be > 0 requests per step, got {arrival_rate!r}")
    if not isinstance(cost, StepCost) or cost.hardware not in rf.HARDWARE:
        raise ValueError(f"cost must be a StepCost whose hardware is one of {sorted(rf.HARDWARE)}, got {cost!r}")
    params = dict(num_requests=num_requests, max_len=max_len, block_size=block_size,
                  memory_tokens=memory_tokens, seed=seed, k=k, acceptance=acceptance, arrival_rate=arrival_rate,
                  cost=cost)
    requests = make_workload(num_requests, max_len, k, acceptance, arrival_rate, seed)
    return FragmentationResult(params, *(_run_design(d, requests, memory_tokens, block_size, k, cost)
                                         for d in ("contiguous", "paged")))
