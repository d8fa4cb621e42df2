import pytest
import torch

from specdec_lab.core.sampling import check_sampling_args, exponential_noise, logits_to_probs, make_generator, sample


def test_temperature_zero_is_one_hot_at_argmax_without_nan():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]])
    p = logits_to_probs(logits, 0.0)
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    assert not torch.isnan(p).any()


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p = logits_to_probs(probs.log(), 1.0, top_p=0.75)
    assert torch.allclose(p, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8), "top-p kept the wrong set"
    p = logits_to_probs(probs.log(), 1.0, top_p=0.5)
    assert torch.allclose(p, torch.tensor([1.0, 0.0, 0.0, 0.0])), "the top token must always be kept"


def test_top_k_keeps_k_tokens():
    p = logits_to_probs(torch.tensor([1.0, 4.0, 3.0, 2.0]), 1.0, top_k=2)
    assert (p > 0).tolist() == [False, True, True, False]


def test_sampler_draws_in_proportion_to_probs_and_never_a_zero_probability_token():
    probs = torch.tensor([0.1, 0.6, 0.3])
    g = make_generator(0, "cpu")
    draws = sample(probs.expand(20000, 3), g)
    freq = torch.bincount(draws, minlength=3).float() / 20000
    assert torch.allclose(freq, probs, atol=0.015), f"sampler is biased: {freq}"
    zeros = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    draws = sample(zeros.expand(20000, 5), g)
    assert set(draws.tolist()) == {1, 3}, "a token with probability 0 was drawn"


def test_exponential_noise_is_exponential_never_zero_and_its_race_draws_in_proportion():
    g = make_generator(0, "cpu")
    e = exponential_noise(200_000, g)
    assert e.shape == (200_000,) and bool((e > 0).all()) and bool(torch.isfinite(e).all()), \
        "a zero draw would make its token win the race, an infinite one make a certain token lose it"
    assert abs(e.mean().item() - 1.0) < 0.01 and abs(e.var().item() - 1.0) < 0.03
    assert abs((e > 1.0).float().mean().item() - torch.exp(torch.tensor(-1.0)).item()) < 0.005
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])
    noise = torch.stack([exponential_noise(5, g) for _ in range(20000)])  # (20000, 5)
    draws = (probs / noise).argmax(-1)  # verification's final draw (verify.draw)
    freq = torch.bincount(draws, minlength=5).float() / 20000
    assert torch.allclose(freq, probs, atol=0.015), f"the race is biased: {freq}"
    assert torch.equal(exponential_noise(64, make_generator(3, "cpu")), exponential_noise(64, make_generator(3, "cpu")))
    one_hot = torch.zeros(49152)
    one_hot[7] = 1.0
    assert all(int((one_hot / exponential_noise(49152, g)).argmax()) == 7 for _ in range(50))


def test_seeded_sampling_repeats():
    probs = torch.full((100, 10), 0.1)
    a = sample(probs, make_generator(7, "cpu"))
    b = sample(probs, make_generator(7, "cpu"))
    c = sample(probs, make_generator(8, "cpu"))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("kwargs,name", [({"temperature": -1.0, "top_p": 1.0}, "temperature"),
                                         ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
                                         ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
                                         ({"temperature": 1.0, "top_p": 1.0, "top_k": -2}, "top_k")])
def test_bad_sampling_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        check_sampling_args(**kwargs)
