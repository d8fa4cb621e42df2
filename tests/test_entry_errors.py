"""Bad input at the public entry points: a ValueError or TypeError that names the parameter, its value
and what is allowed, and an engine that answers the same afterwards."""
import math

import pytest

import specdec_lab as sl


@pytest.fixture(scope="module")
def engine():
    target, draft = sl.tiny_model(0), sl.tiny_model(1)
    return sl.SpeculativeEngine(target, draft, k=3)


PROMPT = [3, 1, 4, 1, 5]


@pytest.mark.parametrize("kwargs, parameter", [
    (dict(temperature=math.inf), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=-0.5), "temperature"),
    (dict(seed="abc"), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(top_p=0.0), "top_p"),
    (dict(k=0), "k"),
    (dict(max_new_tokens=0), "max_new_tokens"),
])
def test_bad_generate_arguments_name_the_parameter_and_leave_the_engine_as_it_was(engine, kwargs, parameter):
    before = engine.generate(PROMPT, max_new_tokens=12, temperature=0.8, seed=5)
    with pytest.raises(ValueError, match=parameter) as err:
        engine.generate(PROMPT, **{"max_new_tokens": 12, **kwargs})
    assert repr(next(iter(kwargs.values())))[:3] in str(err.value), "the message must show the value given"
    after = engine.generate(PROMPT, max_new_tokens=12, temperature=0.8, seed=5)
    assert after.tokens == before.tokens, "a failed call changed what the engine answers"


def test_the_baseline_checks_its_seed_and_temperature_too():
    model = sl.tiny_model(0)
    with pytest.raises(ValueError, match="seed"):
        sl.autoregressive_generate(model, PROMPT, max_new_tokens=4, seed="abc")
    with pytest.raises(ValueError, match="temperature"):
        sl.autoregressive_generate(model, PROMPT, max_new_tokens=4, temperature=float("inf"))


@pytest.mark.parametrize("call, parameter", [
    (lambda: sl.load_pair("", ""), "target"),
    (lambda: sl.load_pair("HuggingFaceTB/SmolLM2-135M-Instruct", "  "), "draft"),
    (lambda: sl.load_pair(None, "x"), "target"),
    (lambda: sl.load_default_pair(device="tpu9"), "device"),
    (lambda: sl.load_pair("a", "b", device="tpu9"), "device"),
])
def test_loading_refuses_bad_sources_and_devices_before_touching_the_hub(call, parameter):
    with pytest.raises(ValueError, match=parameter):
        call()


def test_engine_construction_names_what_is_wrong():
    target = sl.tiny_model(0)
    with pytest.raises(ValueError, match="cache"):
        sl.SpeculativeEngine(target, sl.tiny_model(1), cache="ring")
    with pytest.raises(ValueError, match="vocabulary"):
        sl.SpeculativeEngine(target, sl.tiny_model(1, vocab_size=32), k=2)
    with pytest.raises(TypeError, match="draft must be"):
        sl.SpeculativeEngine(target, "a draft", k=2)
    with pytest.raises(TypeError, match="target must be"):
        sl.SpeculativeEngine("a target", sl.tiny_model(1), k=2)
    with pytest.raises(TypeError, match="accelerate"):
        sl.load_pair("a", "b", accelerate="yes")


def test_static_shapes_refuse_what_they_cannot_run(capsys):
    target, draft = sl.tiny_model(0), sl.tiny_model(1)
    with pytest.raises(ValueError, match="cache='paged' cannot hold a model with fixed shapes"):
        sl.SpeculativeEngine(sl.compiled_twin(target), draft, cache="paged")
    with pytest.raises(ValueError, match="needs a plain model"):
        sl.use_static_shapes(sl.accelerate(sl.tiny_model(2)))
    from specdec_lab.__main__ import main
    assert main(["generate", "--prompt", "hi", "--k", "4", "--compile", "--self-draft"]) == 2
    assert "--compile and --self-draft cannot be combined" in capsys.readouterr().err
