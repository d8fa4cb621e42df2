"""`python -m specdec_lab serve`: its options, their checks, and serving a loaded pair until a signal."""
import argparse
import math
import time

from ..core.config import MAX_K
from ..serve import GoodputPolicy, KSchedule, Server, measure_step_costs
from ..serve.policy import step_cost_budget
from .app import Service, check_port_free, run


def serve_k(text):
    """--k: an int in [0, MAX_K], or schedule / goodput as bench --serve has them."""
    if text in ("schedule", "goodput"):
        return text
    try:
        k = int(text)
    except ValueError:
        k = -1
    if not 0 <= k <= MAX_K:
        raise argparse.ArgumentTypeError(f"--k must be an int in [0, {MAX_K}], schedule or goodput, got {text!r}")
    return k


def add_serve_parser(sub, common):
    s = sub.add_parser("serve", parents=[common], help="an OpenAI-compatible HTTP server (completions, chat, "
                       "/v1/models, /health, /metrics) over the batched speculative server",
                       description="Serve the pair over HTTP with OpenAI's API (docs/design.md, \"The service\"): "
                                   "POST /v1/completions and /v1/chat/completions (stream: true as server-sent "
                                   "events), GET /v1/models, /health and /metrics (vLLM's metric names). "
                                   "SIGINT/SIGTERM stop admitting, let what runs finish (30 s), then exit.")
    s.add_argument("--port", type=int, default=8000, help="TCP port (default %(default)s)")
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (default %(default)s, loopback only; "
                   "0.0.0.0 exposes it to the network)")
    s.add_argument("--target", help="hub id, folder or .gguf (default: SmolLM2-135M-Instruct)")
    s.add_argument("--draft", help="hub id or folder of the draft (default: the shipped draft)")
    s.add_argument("--k", type=serve_k, default="goodput", help="draft length: an int in [0, 16] (0: plain "
                   "batched decoding), schedule (K by batch size, as bench --serve) or goodput (each step the K in "
                   "0..4 with the most tokens a second, from step costs it measures before it serves, a few "
                   "seconds, and the acceptance it sees; default %(default)s)")
    s.add_argument("--max-batch", type=int, default=8, help="requests decoded together (default %(default)s)")
    s.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond the batch; more are "
                   "answered 429 (default %(default)s)")
    s.add_argument("--max-seq-len", type=int, default=2048, help="prompt + answer + a step's lookahead per request, "
                   "up to the models' own limit (default %(default)s)")
    s.add_argument("--api-key", help="require Authorization: Bearer KEY on /v1 (default: no key)")
    s.add_argument("--served-model-name", help="the model's name in requests and /v1/models (default: the "
                   "target's folder name)")
    s.add_argument("--device", default="cpu", help="where the models run (default %(default)s)")
    s.add_argument("--threads", type=int, help="torch threads (default: OMP_NUM_THREADS where it is set, else "
                   "torch's own choice, one per core)")
    s.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default float32 on the CPU, bfloat16 on CUDA")
    return s


def _in(name, value, low, high, what):
    if not low <= value <= high:
        raise ValueError(f"{name} must be {what}, got {value}")


def check_serve_args(args, cfg):
    """serve's option values, before anything loads (a model takes seconds to load)."""
    _in("--port", args.port, 0, 65535, "an int in [0, 65535] (0: any free port)")
    _in("--max-batch", args.max_batch, 1, math.inf, "an int >= 1")
    _in("--max-waiting", args.max_waiting, 0, math.inf, "an int >= 0")
    _in("--max-seq-len", args.max_seq_len, 2 * (MAX_K + 2), math.inf, f"an int >= {2 * (MAX_K + 2)}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key must not be empty (leave it out to serve without a key)")
    if args.k == 0 and args.draft:
        raise ValueError("--k 0 is plain batched decoding: it takes no --draft")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be an int >= 1, got {args.threads}")
    if args.k == "goodput" and cost_context(args.max_seq_len, cfg) < COST_MIN_CONTEXT:
        shortest = args.max_seq_len + COST_MIN_CONTEXT - cost_context(args.max_seq_len, cfg)
        raise ValueError(f"--k goodput measures its step costs on rows of up to {shortest} positions: use "
                         f"--max-seq-len >= {shortest} with it, or an int --k (got --max-seq-len {args.max_seq_len})")
    check_port_free(args.host, args.port)


GOODPUT_K_MAX = 4
COST_REPS = 2  # timed rounds of each step cost; the fastest is kept
COST_MIN_CONTEXT = 8  # the shortest prompt the step costs are measured on


def cost_context(max_seq_len, cfg) -> int:
    """The prompt length of the goodput policy's step costs: bench --serve's, or less where a row's
    prompt, the tokens the measurement commits and one step's lookahead would pass `max_seq_len`."""
    room = max_seq_len - step_cost_budget(range(GOODPUT_K_MAX + 1), COST_REPS) - GOODPUT_K_MAX - 1
    return min(cfg.context, room)


def cost_batch_sizes(max_batch) -> tuple:
    """The batch sizes whose step costs the goodput policy measures: 1, 2, 4, ... below `max_batch`
    (up to 16), and `max_batch` itself if it is 16 or less; larger batches are extrapolated
    linearly in rows (GoodputPolicy.cost)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    return (*sizes, min(max_batch, 16))


def k_policy(choice, server, cfg, log):
    """The Server's k: the int, the schedule of bench --serve's `cfg`, or the goodput policy on step costs
    measured on `server`'s own engine first (a few seconds on a 2-core CPU, announced on `log`)."""
    if choice == "schedule":
        return KSchedule(cfg.schedule)
    if choice != "goodput":
        return choice
    sizes, ks = cost_batch_sizes(server.max_batch), tuple(range(GOODPUT_K_MAX + 1))
    log(f"measuring step costs for the goodput policy at batch sizes {sizes}, K {ks} ...")
    t0 = time.perf_counter()
    context = cost_context(server.engine.max_seq_len, cfg)
    costs = measure_step_costs(server.engine, sizes, ks, context=context, reps=COST_REPS)
    log(f"measured in {time.perf_counter() - t0:.1f} s; each step runs the K with the most tokens a second "
        f"(K = 0, plain decoding, where drafting does not pay)")
    return GoodputPolicy(costs, k_max=GOODPUT_K_MAX)


def serve_main(args, pair, name, cfg, log):
    """Serve `pair` as `name` with the options of add_serve_parser until SIGINT or SIGTERM; `cfg` holds
    bench --serve's schedule and step-cost settings (for --k schedule and goodput)."""
    plain = args.k == 0
    server = Server(pair.target, None if plain else pair.draft, max_batch=args.max_batch,
                    max_seq_len=args.max_seq_len, k=0, keep_steps=False, tokenizer=pair.tokenizer)
    server.k = 0 if plain else k_policy(args.k, server, cfg, log)
    service = Service(server, name, max_waiting=args.max_waiting, api_key=args.api_key)
    log(f"serving {name} (k {args.k}, max batch {args.max_batch}) at http://{args.host}:{args.port}/v1; "
        f"Ctrl-C stops it")
    run(service, host=args.host, port=args.port)
