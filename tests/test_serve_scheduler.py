"""serve.Server: continuous batching, preemption, cancellation and bad input, on tiny models."""
import pytest
import torch

import specdec_lab as sl
from specdec_lab.serve import RequestFailed, Server


def _pair():
    return sl.tiny_model(0), sl.tiny_model(1, n_layers=1)


PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3], [20, 21, 22], [30, 31, 32, 33],
           [40, 41], [50, 51, 52, 53, 54, 55]]
BUDGETS = [20, 6, 14, 25, 9, 17, 3, 12]


def _blocks(server):
    return server.engine.target_kv.used_blocks, server.engine.draft_kv.used_blocks


def test_greedy_requests_arriving_and_leaving_midway_equal_batch_1_decoding():
    target, draft = _pair()
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=3)
    handles = [server.submit(p, max_new_tokens=n, k=[4, 2, 0, 3][i % 4]) for i, (p, n) in
               enumerate(zip(PROMPTS[:3], BUDGETS[:3]))]
    server.step()
    server.step()
    handles += [server.submit(p, max_new_tokens=n) for p, n in zip(PROMPTS[3:], BUDGETS[3:])]
    assert len(server.waiting) > 0, "max_batch=4 keeps some requests waiting"
    server.run_until_idle()
    for p, n, h in zip(PROMPTS, BUDGETS, handles):
        assert h.result().tokens == sl.autoregressive_generate(target, p, max_new_tokens=n).tokens, p
    assert _blocks(server) == (0, 0)


def test_a_pool_too_small_preempts_and_still_completes_every_request_unchanged():
    target, draft = _pair()
    roomy = Server(target, draft, max_batch=8, block_size=4, max_seq_len=128, k=3)
    tight = Server(target, draft, max_batch=8, block_size=4, max_seq_len=128, k=3, num_blocks=14)
    out = {}
    for server in (roomy, tight):
        hs = [server.submit(p, max_new_tokens=n, temperature=[0.0, 0.9][i % 2], seed=i)
              for i, (p, n) in enumerate(zip(PROMPTS, BUDGETS))]
        server.run_until_idle()
        out[server] = [h.result().tokens for h in hs]
        assert all(h.status == "finished" for h in hs)
        assert _blocks(server) == (0, 0), "every block must be back in the pool"
    assert tight.preemptions > 0 and roomy.preemptions == 0
    assert out[tight] == out[roomy], "a preempted request must continue where it was (recompute)"


def test_a_cancelled_request_frees_its_blocks_and_leaves_the_others_unchanged():
    target, draft = _pair()
    reference = Server(target, draft, max_batch=8, block_size=4, max_seq_len=128, k=2)
    expected = [reference.submit(p, max_new_tokens=n, temperature=0.8, seed=i)
                for i, (p, n) in enumerate(zip(PROMPTS[:4], BUDGETS[:4]))]
    reference.run_until_idle()
    server = Server(target, draft, max_batch=8, block_size=4, max_seq_len=128, k=2)
    hs = [server.submit(p, max_new_tokens=n, temperature=0.8, seed=i)
          for i, (p, n) in enumerate(zip(PROMPTS[:4], BUDGETS[:4]))]
    queued = server.submit([5, 5], max_new_tokens=8)
    queued.cancel()  # cancelled while waiting
    server.step()
    server.step()
    before = _blocks(server)
    hs[0].cancel()  # cancelled mid-generation
    assert _blocks(server)[0] < before[0], "a cancelled request's blocks go back at once"
    server.run_until_idle()
    assert hs[0].result().finish_reason == "cancelled" and queued.result().tokens == []
    assert 0 < len(hs[0].tokens) < BUDGETS[0]
    for h, e in zip(hs[1:], expected[1:]):
        assert h.result().tokens == e.result().tokens
    assert _blocks(server) == (0, 0)


def test_a_callback_that_raises_fails_its_request_only():
    target, draft = _pair()
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=2)
    seen = []

    def bad(handle, new):
        raise KeyError("boom")

    good = server.submit(PROMPTS[0], max_new_tokens=10, on_step=lambda h, new: seen.extend(new))
    broken = server.submit(PROMPTS[1], max_new_tokens=10, on_step=bad)
    server.run_until_idle()
    with pytest.raises(RequestFailed, match="boom"):
        broken.result()
    assert isinstance(broken.error, KeyError)
    assert good.result().tokens == seen == sl.autoregressive_generate(target, PROMPTS[0], max_new_tokens=10).tokens
    assert _blocks(server) == (0, 0)


@pytest.mark.parametrize("kwargs,name", [
    (dict(prompt=[]), "prompt"), (dict(prompt=[1, 999]), "token ids"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"), (dict(top_p=1.5), "top_p"), (dict(seed="x"), "seed"),
    (dict(k=17), "k"), (dict(on_step=3), "on_step"), (dict(max_new_tokens=500), "max_seq_len"),
])
def test_bad_input_is_refused_at_submit_and_leaves_the_server_unchanged(kwargs, name):
    target, draft = _pair()
    server = Server(target, draft, max_batch=4, block_size=4, max_seq_len=128, k=2)
    ok = server.submit([1, 2], max_new_tokens=5)
    args = dict(prompt=[1, 2, 3], max_new_tokens=5) | kwargs
    with pytest.raises(ValueError, match=name):
        server.submit(args.pop("prompt"), **args)
    assert list(server.waiting) == [ok]
    assert ok.result().tokens == sl.autoregressive_generate(target, [1, 2], max_new_tokens=5).tokens


def test_a_request_larger_than_the_pool_is_refused():
    target, draft = _pair()
    server = Server(target, draft, block_size=4, max_seq_len=128, num_blocks=8)
    with pytest.raises(ValueError, match="blocks"):
        server.submit([1, 2, 3], max_new_tokens=40)


def test_streaming_yields_each_steps_new_tokens():
    target, draft = _pair()
    server = Server(target, draft, max_batch=2, block_size=4, max_seq_len=128, k=3)
    other = server.submit(PROMPTS[2], max_new_tokens=12)
    h = server.submit(PROMPTS[1], max_new_tokens=15)
    chunks = list(h.stream())
    assert len(chunks) > 1 and [t for c in chunks for t in c] == h.result().tokens
    assert other.result().tokens == sl.autoregressive_generate(target, PROMPTS[2], max_new_tokens=12).tokens


def test_plain_batched_decoding_without_a_draft_equals_batch_1():
    target, _ = _pair()
    server = Server(target, None, max_batch=3, block_size=4, max_seq_len=128)
    hs = [server.submit(p, max_new_tokens=n) for p, n in zip(PROMPTS[:5], BUDGETS[:5])]
    server.run_until_idle()
    for p, n, h in zip(PROMPTS, BUDGETS, hs):
        assert h.result().tokens == sl.autoregressive_generate(target, p, max_new_tokens=n).tokens
    assert all(r.k == 0 for h in hs for r in h.result().steps)


def test_bad_server_arguments_are_refused():
    target, draft = _pair()
    for kwargs, name in [(dict(max_batch=0), "max_batch"), (dict(k=-1), "k"), (dict(num_blocks=0), "num_blocks")]:
        with pytest.raises(ValueError, match=name):
            Server(target, draft, **kwargs)


@pytest.mark.slow
def test_default_pair_greedy_batch_of_8_with_arrivals_and_departures_equals_batch_1_decoding():
    from specdec_lab.core.text import encode_prompt
    from specdec_lab.train.handwritten import HANDWRITTEN_PROMPTS
    from specdec_lab.train.prompts import BENCH_PROMPTS
    pair = sl.load_default_pair()
    prompts = BENCH_PROMPTS[::3] + HANDWRITTEN_PROMPTS[::18]  # 8 benchmark and 4 hand-written prompts
    ids = [encode_prompt(pair.tokenizer, p) for p in prompts]
    budgets = [24, 8, 16, 24, 12, 20, 8, 24, 16, 12, 24, 20]
    server = Server(pair.target, pair.draft, max_batch=8, max_seq_len=512, k=4)
    handles = []
    for i, (x, n) in enumerate(zip(ids, budgets)):
        handles.append(server.submit(x, max_new_tokens=n, k=[4, 3, 0, 5][i % 4]))
        if i >= 5:
            server.step()  # later requests arrive while earlier ones run and leave
    server.run_until_idle()
    for x, n, h in zip(ids, budgets, handles):
        assert h.result().tokens == sl.autoregressive_generate(pair.target, x, max_new_tokens=n).tokens
    assert server.engine.target_kv.used_blocks == 0 == server.engine.draft_kv.used_blocks
