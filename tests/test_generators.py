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
    from redline.actors.generators import GeneratorConfig, HFGenerator, SamplingParams
    from redline.actors.providers.hf import truncate_at_stop
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
    with pytest.raises(RedlineError, match="^config: generator 'g': provider openai: base_url: Field required$"):
        validate_config(GeneratorConfig, {"name": "g", "provider": "openai", "model": "m"})
    with pytest.raises(RedlineError, match="^config: generator 'g' needs model"):
        validate_config(GeneratorConfig, {"name": "g", "kind": "bedrock"})
    with pytest.raises(RedlineError, match="generator 'g': provider hf: base_url: Extra inputs are not permitted"):
        validate_config(GeneratorConfig, {"name": "g", "model": "m", "base_url": "http://127.0.0.1:1/v1"})
    with pytest.raises(RedlineError, match="provider bedrock: region: Input should be a valid string"):
        validate_config(GeneratorConfig, {"name": "g", "kind": "bedrock", "model": "m", "region": 3})
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


def test_a_new_provider_with_a_setting_of_its_own_is_one_class_and_its_registration(monkeypatch):
    """Configs validate provider names and each provider's own settings against the registry: a provider
    registered once, with its `Options`, is accepted by judges, LLM detectors and generators alike, reads its
    setting from the same flat config, answers through the same client, and its setting is in the run key
    by the role it declares; a typo in either fails when the config loads."""
    from redline.actors import providers as P
    from redline.actors.detectors import DetectorConfig
    from redline.actors.generators import GeneratorConfig, build_generator
    from redline.actors.judges import JudgeConfig, LLMJudge
    from redline.actors.providers import registry
    from redline.cluster.config import Result, Strict, config_hash

    monkeypatch.setattr(registry.PROVIDERS, "_plugins", registry.PROVIDERS.all())  # the echo provider goes after

    class EchoOptions(Strict):
        times: int = Result(1, ge=1, description="How many times the last message is repeated.")

    @P.register_provider
    class Echo(P.ChatProvider):
        name = "echo"
        description = "repeats the last message"
        Options = EchoOptions

        def chat_one(self, messages, params):
            text = " ".join([messages[-1]["content"]] * self.options.times)
            return P.PromptResult(1, [P.Completion(text, "stop", 1)] * params.n)

    assert "echo" in P.providers()
    gen = GeneratorConfig.model_validate({"name": "e", "provider": "echo", "model": "parrot", "times": 2})
    [result] = build_generator(gen).generate(["hello"], P.SamplingParams(n=2))
    assert [c.text for c in result.completions] == ["hello hello", "hello hello"]
    judge = LLMJudge(JudgeConfig.model_validate({"provider": "echo", "model": "parrot", "cache_dir": None}),
                     default_template="yes {text}")
    assert [j.verdict for j in judge.judge(["a", "b"])] == ["yes", "yes"]
    detector = {"name": "d", "kind": "llm-judge", "provider": "echo", "model": "parrot"}
    assert config_hash(DetectorConfig.model_validate({**detector, "times": 3})) != \
        config_hash(DetectorConfig.model_validate(detector))  # a Result setting: another run
    with pytest.raises(ValueError, match="generator 'e': provider echo: times: Input should be greater"):
        GeneratorConfig.model_validate({"name": "e", "provider": "echo", "model": "parrot", "times": 0})
    with pytest.raises(ValueError, match="judge: provider echo: tiems: Extra inputs are not permitted"):
        DetectorConfig.model_validate({**detector, "tiems": 3})
    with pytest.raises(ValueError, match=r"unknown provider 'ecoh' \(known: openai, redline, bedrock, hf, echo\)"):
        JudgeConfig.model_validate({"provider": "ecoh", "model": "parrot"})
