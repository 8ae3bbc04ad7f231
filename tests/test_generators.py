"""Generators: prompt formats, stop sequences, limits and errors (the Serve tests cover HTTP)."""

from __future__ import annotations

import pytest

from conftest import free_port

CHAT = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "how are you"}]


def test_causal_prompts_follow_dialogpt_or_the_chat_template(tiny_causal_lm):
    from redline.actors.generators import GeneratorConfig, HFGenerator

    plain = HFGenerator(GeneratorConfig(name="g", model=str(tiny_causal_lm)))
    assert not plain.seq2seq
    assert plain.prompt_from_messages(CHAT) == "hello there</s>hi</s>how are you</s>"
    template = "{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    templated = HFGenerator(GeneratorConfig(name="g", model=str(tiny_causal_lm), chat_template=template))
    assert templated.prompt_from_messages(CHAT) == "<user> hello there\n<assistant> hi\n<user> how are you\n<assistant>"


def test_seq2seq_generation_batches_prompts_and_counts_tokens(tiny_seq2seq):
    from redline.actors.generators import GeneratorConfig, HFGenerator, SamplingParams

    gen = HFGenerator(GeneratorConfig(name="b", model=str(tiny_seq2seq)))
    assert gen.seq2seq and gen.prompt_from_messages(CHAT) == "hello there\nhi\nhow are you"
    out = gen.generate(["you are nice", "go away now please"], SamplingParams(n=3, max_tokens=6, seed=1))
    assert [len(r.completions) for r in out] == [3, 3]
    assert out[0].prompt_tokens < out[1].prompt_tokens
    assert all(c.tokens <= 6 and c.finish_reason in ("stop", "length") for r in out for c in r.completions)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    assert gen.generate(["you are nice"], greedy) == gen.generate(["you are nice"], greedy)


def test_limits_and_stops(tiny_causal_lm):
    from redline.actors.generators import (
        GeneratorConfig,
        HFGenerator,
        SamplingParams,
        truncate_at_stop,
    )
    from redline.errors import RedlineError

    assert truncate_at_stop("a b. c\nd", [".", "\n"]) == ("a b", True)
    assert truncate_at_stop("abc", ["x", ""]) == ("abc", False)
    gen = HFGenerator(GeneratorConfig(name="g", model=str(tiny_causal_lm), max_input_tokens=8))
    with pytest.raises(RedlineError, match="accepts at most 8"):
        gen.generate(["word " * 20], SamplingParams())
    long = gen.generate(["hi"], SamplingParams(max_tokens=100_000, temperature=0))[0].completions[0]
    assert long.tokens <= gen.max_positions


def test_generator_errors_are_one_line(tmp_path):
    from redline.actors.generators import (
        GeneratorConfig,
        SamplingParams,
        build_generator,
    )
    from redline.cluster.config import validate_config
    from redline.errors import RedlineError

    with pytest.raises(RedlineError, match="no model saved with save_pretrained"):
        build_generator(GeneratorConfig(name="g", model=str(tmp_path / "nothing")))
    with pytest.raises(RedlineError, match="needs base_url"):
        validate_config(GeneratorConfig, {"name": "g", "kind": "openai", "model": "m"})
    with pytest.raises(RedlineError, match="kind bedrock needs model"):
        validate_config(GeneratorConfig, {"name": "g", "kind": "bedrock"})
    gen = build_generator(GeneratorConfig(name="g", kind="openai", base_url=f"http://127.0.0.1:{free_port()}/v1",
                                          model="m", max_retries=0, timeout_s=5))
    with pytest.raises(RedlineError, match="cannot reach"):
        gen.chat([[{"role": "user", "content": "hi"}]], SamplingParams())


def test_bedrock_generator_speaks_converse_through_boto3(monkeypatch):
    from redline.actors.generators import (
        GeneratorConfig,
        SamplingParams,
        build_generator,
    )
    from redline.errors import RedlineError

    from standins import bedrock

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-test")
    with bedrock() as aws:
        cfg = {"name": "claude", "kind": "bedrock", "model": "anthropic.claude-3-haiku", "region": "us-east-1",
               "endpoint_url": aws.url, "max_retries": 0, "additional_fields": {"anthropic_beta": []}}
        gen = build_generator(GeneratorConfig(**cfg))
        out = gen.chat([[{"role": "system", "content": "be kind"}, {"role": "user", "content": "hello there"}],
                        [{"role": "user", "content": "one two three four five six"}]],
                       SamplingParams(n=3, max_tokens=5, temperature=0.7, top_p=0.9, top_k=40, stop=("\n",)))
        assert [[c.text for c in r.completions] for r in out] == [["you said: hello there"] * 3,
                                                                   ["you said: one two three"] * 3]
        assert [c.finish_reason for c in out[1].completions] == ["length"] * 3
        assert out[0].completions[0].finish_reason == "stop" and out[0].completions[0].tokens == 4
        sent = aws.httpd.converse_bodies
        assert len(sent) == 6  # Converse returns one completion: n requests per conversation
        first = next(b for b in sent if b["messages"][-1]["content"][0]["text"] == "hello there")
        assert first["system"] == [{"text": "be kind"}] and len(first["messages"]) == 1
        assert first["inferenceConfig"] == {"maxTokens": 5, "temperature": 0.7, "topP": 0.9, "stopSequences": ["\n"]}
        assert first["additionalModelRequestFields"] == {"anthropic_beta": [], "top_k": 40}
        assert "AKIDTEST" in first["authorization"] and "secret-test" not in first["authorization"]  # SigV4-signed

        with pytest.raises(RedlineError, match="ValidationException: The provided model identifier is invalid"):
            build_generator(GeneratorConfig(**{**cfg, "model": "missing"})).chat(
                [[{"role": "user", "content": "hi"}]], SamplingParams())
    down = build_generator(GeneratorConfig(**{**cfg, "endpoint_url": f"http://127.0.0.1:{free_port()}"}))
    with pytest.raises(RedlineError, match="cannot reach Bedrock"):
        down.generate(["hi"], SamplingParams())


def test_a_new_provider_is_one_class_and_its_registration(monkeypatch):
    """Configs validate provider names against the registry: a provider registered once is accepted by
    judges and generators alike and answers through the same client; a typo fails when the config loads."""
    from redline.actors import providers as P
    from redline.actors.generators import GeneratorConfig, build_generator
    from redline.actors.judges import ChatModelOptions
    from redline.actors.providers import registry

    monkeypatch.setattr(registry.PROVIDERS, "_plugins", registry.PROVIDERS.all())  # the echo provider goes after

    @P.register_provider
    class Echo(P.ChatProvider):
        name = "echo"
        description = "repeats the last message"
        needs = {"model": "any name"}

        def chat_one(self, messages, params):
            return P.PromptResult(1, [P.Completion(messages[-1]["content"], "stop", 1)] * params.n)

    assert "echo" in P.providers()
    gen = GeneratorConfig.model_validate({"name": "e", "kind": "echo", "model": "parrot"})
    assert ChatModelOptions.model_validate({"provider": "echo", "model": "parrot"}).provider == "echo"
    [result] = build_generator(gen).generate(["hello there"], P.SamplingParams(n=2))
    assert [c.text for c in result.completions] == ["hello there", "hello there"]
    with pytest.raises(ValueError, match="generator 'e': kind echo needs model"):
        GeneratorConfig.model_validate({"name": "e", "kind": "echo"})
    with pytest.raises(ValueError, match=r"unknown provider 'ecoh' \(known: openai, redline, bedrock, hf, echo\)"):
        ChatModelOptions.model_validate({"provider": "ecoh", "model": "parrot"})
