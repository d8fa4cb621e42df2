"""launches.py: kernel launches of the eager forward, counted on the meta device."""
import pytest
import torch

from specdec_lab.analysis.launches import count_call_launches, count_launches, launches_kernel
from specdec_lab.core.config import ModelConfig


def tiny(n_layers):
    return ModelConfig(vocab_size=64, dim=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=8,
                       intermediate_size=64, max_seq_len=256)


def test_launches_grow_linearly_with_the_layers():
    counts = {n: count_launches(tiny(n), k=4)[1].launches for n in (1, 2, 3, 5)}
    per_layer = counts[2] - counts[1]
    assert per_layer > 10, "a decoder block (two norms, attention, SwiGLU) is more than ten kernels"
    assert counts[3] - counts[2] == per_layer and counts[5] - counts[3] == 2 * per_layer, counts
    assert counts[1] > per_layer, "the embedding, the final norm and the head come once per forward"


def test_every_block_runs_its_four_products_and_two_attention_products():
    for n in (1, 3):
        ops = count_launches(tiny(n), k=2)[1].by_op
        assert ops["aten.mm"] == 4 * n + 1, "wqkv, wo, w13, w2 per layer, then the head"
        assert ops["aten.bmm"] == 2 * n, "scores and the weighted sum of values per layer"


def test_a_verification_pass_launches_about_as_many_kernels_as_a_decode_step():
    c = count_launches(tiny(4), k=7)
    assert set(c) == {1, 8}
    assert c[1].launches <= c[8].launches < 1.5 * c[1].launches, "launches depend on layers, not on T"
    assert c[8].by_op.get("aten.masked_fill", 0) >= 1, "only T > 1 builds the K+1 mask"


def test_views_are_not_counted_as_launches():
    assert not launches_kernel(torch.ops.aten.view.default)
    assert not launches_kernel(torch.ops.aten.transpose.int)
    assert launches_kernel(torch.ops.aten.mm.default)
    c = count_launches(tiny(2))[1]
    assert c.views > 0 and not any(name in c.by_op for name in ("aten.view", "aten.transpose", "aten.slice"))


@pytest.mark.parametrize("kwargs,name", [({"cfg": "llama"}, "cfg"), ({"cfg": tiny(1), "k": 0}, "k"),
                                         ({"cfg": tiny(1), "context": -1}, "context")])
def test_bad_input_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        count_launches(**kwargs)


def test_a_single_call_is_counted_like_a_forward():
    x = torch.ones(4, 8)
    counted = count_call_launches(lambda t: (t * 2).sum().view(1), x)
    assert counted.tokens == 0 and counted.launches == 2 and counted.by_op == {"aten.mul": 1, "aten.sum": 1}
    assert counted.views == 1, "the view is seen and not counted as a launch"
    with pytest.raises(ValueError, match="fn"):
        count_call_launches(3)
