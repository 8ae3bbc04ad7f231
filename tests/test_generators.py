"""Generators: prompt formats, stop sequences, limits and errors (the Serve tests cover HTTP)."""

from __future__ import annotations

import pytest

from conftest import free_port

CHAT = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "how are you"}]


def test_causal_prompts_follow_dialogpt_or_the_chat_template(tiny_causal_lm):
    from redline.actors.generators import HFGenerator
    from redline.cluster.config import GeneratorConfig

    plain = HFGenerator(GeneratorConfig(name="g", model=str(tiny_causal_lm)))
    assert not plain.seq2seq
    assert plain.prompt_from_messages(CHAT) == "hello there</s>hi</s>how are you</s>"
    template = "{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    templated = HFGenerator(GeneratorConfig(name="g", model=str(tiny_causal_lm), chat_template=template))
    assert templated.prompt_from_messages(CHAT) == "<user> hello there\n<assistant> hi\n<user> how are you\n<assistant>"


def test_seq2seq_generation_batches_prompts_and_counts_tokens(tiny_seq2seq):
    from redline.actors.generators import HFGenerator, SamplingParams
    from redline.cluster.config import GeneratorConfig

    gen = HFGenerator(GeneratorConfig(name="b", model=str(tiny_seq2seq)))
    assert gen.seq2seq and gen.prompt_from_messages(CHAT) == "hello there\nhi\nhow are you"
    out = gen.generate(["you are nice", "go away now please"], SamplingParams(n=3, max_tokens=6, seed=1))
    assert [len(r.completions) for r in out] == [3, 3]
    assert out[0].prompt_tokens < out[1].prompt_tokens
    assert all(c.tokens <= 6 and c.finish_reason in ("stop", "length") for r in out for c in r.completions)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    assert gen.generate(["you are nice"], greedy) == gen.generate(["you are nice"], greedy)


def test_limits_and_stops(tiny_causal_lm):
    from redline.actors.generators import HFGenerator, SamplingParams, truncate_at_stop
    from redline.cluster.config import GeneratorConfig
    from redline.errors import RedlineError

    assert truncate_at_stop("a b. c\nd", [".", "\n"]) == ("a b", True)
    assert truncate_at_stop("abc", ["x", ""]) == ("abc", False)
    gen = HFGenerator(GeneratorConfig(name="g", model=str(tiny_causal_lm), max_input_tokens=8))
    with pytest.raises(RedlineError, match="accepts at most 8"):
        gen.generate(["word " * 20], SamplingParams())
    long = gen.generate(["hi"], SamplingParams(max_tokens=100_000, temperature=0))[0].completions[0]
    assert long.tokens <= gen.max_positions


def test_generator_errors_are_one_line(tmp_path):
    from redline.actors.generators import SamplingParams, build_generator
    from redline.cluster.config import GeneratorConfig, validate_config
    from redline.errors import RedlineError

    with pytest.raises(RedlineError, match="no model saved with save_pretrained"):
        build_generator(GeneratorConfig(name="g", model=str(tmp_path / "nothing")))
    with pytest.raises(RedlineError, match="needs base_url"):
        validate_config(GeneratorConfig, {"name": "g", "kind": "openai", "model": "m"})
    gen = build_generator(GeneratorConfig(name="g", kind="openai", base_url=f"http://127.0.0.1:{free_port()}/v1",
                                          model="m", max_retries=0, timeout_s=5))
    with pytest.raises(RedlineError, match="cannot reach"):
        gen.chat([[{"role": "user", "content": "hi"}]], SamplingParams())
