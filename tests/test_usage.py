"""``llm_db.Usage``: each provider's usage object in the price book's disjoint token
classes, its overlaps removed (docs/architecture.md "The price book").

The shapes are the providers' documented ones:
- OpenAI Chat Completions ``usage`` (https://platform.openai.com/docs/api-reference/chat/object):
  ``prompt_tokens_details.cached_tokens`` is part of ``prompt_tokens`` and
  ``completion_tokens_details.reasoning_tokens`` part of ``completion_tokens``; the
  Responses API's ``usage`` the same with ``input_tokens`` and ``output_tokens``.
- Anthropic Messages ``usage`` (https://docs.anthropic.com/en/api/messages):
  ``input_tokens`` is the input after the last cache breakpoint, beside
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` (split by lifetime in
  ``cache_creation``).
- Gemini ``usageMetadata`` (https://ai.google.dev/api/generate-content#UsageMetadata):
  ``promptTokenCount`` includes ``cachedContentTokenCount``; ``thoughtsTokenCount`` and
  ``toolUsePromptTokenCount`` are beside the candidates and the prompt.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from llm_db import Usage


def test_openai_chat_completions_from_a_dict_and_from_an_sdk_object() -> None:
    raw = {
        "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 192, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }
    expected = Usage(input=86, cache_read=1920, output=108, reasoning=192)
    assert Usage.from_openai(raw) == expected
    sdk = SimpleNamespace(
        prompt_tokens=2006, completion_tokens=300, total_tokens=2306,
        prompt_tokens_details=SimpleNamespace(cached_tokens=1920, audio_tokens=None),
        completion_tokens_details=SimpleNamespace(reasoning_tokens=192),
    )
    assert Usage.from_openai(sdk) == expected
    # the totals are kept: nothing counted twice, nothing lost
    assert expected.prompt == 2006 and expected.output + expected.reasoning == 300


def test_openai_without_details_is_all_input_and_output() -> None:
    assert Usage.from_openai({"prompt_tokens": 10, "completion_tokens": 5}) == Usage(input=10, output=5)
    assert Usage.from_openai({"prompt_tokens": 10, "completion_tokens": 5,
                              "prompt_tokens_details": None, "completion_tokens_details": None}) == \
        Usage(input=10, output=5)


def test_openai_responses() -> None:
    raw = {"input_tokens": 328, "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": 52, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 380}
    assert Usage.from_openai(raw) == Usage(input=328, output=52)
    raw = {"input_tokens": 75, "output_tokens": 1186, "output_tokens_details": {"reasoning_tokens": 1024}}
    assert Usage.from_openai(raw) == Usage(input=75, output=162, reasoning=1024)


def test_anthropic_cache_reads_and_writes_are_beside_the_input() -> None:
    raw = {"input_tokens": 50, "cache_read_input_tokens": 100000, "cache_creation_input_tokens": 248,
           "output_tokens": 503}
    # without the split, every write is a 5-minute write (the API's default lifetime)
    assert Usage.from_anthropic(raw) == Usage(input=50, cache_read=100000, cache_write_5m=248, output=503)
    split = dict(raw, cache_creation={"ephemeral_5m_input_tokens": 48, "ephemeral_1h_input_tokens": 200})
    assert Usage.from_anthropic(split) == Usage(input=50, cache_read=100000, cache_write_5m=48,
                                                cache_write_1h=200, output=503)
    sdk = SimpleNamespace(input_tokens=50, cache_read_input_tokens=None, cache_creation_input_tokens=None,
                          cache_creation=None, output_tokens=7, server_tool_use=None)
    assert Usage.from_anthropic(sdk) == Usage(input=50, output=7)


def test_anthropic_a_split_that_disagrees_with_the_total_is_refused() -> None:
    raw = {"input_tokens": 1, "cache_creation_input_tokens": 10, "output_tokens": 1,
           "cache_creation": {"ephemeral_5m_input_tokens": 3, "ephemeral_1h_input_tokens": 3}}
    with pytest.raises(ValueError, match="cache_creation"):
        Usage.from_anthropic(raw)


def test_gemini_rest_and_sdk_spellings() -> None:
    rest = {"promptTokenCount": 12000, "cachedContentTokenCount": 8000, "candidatesTokenCount": 500,
            "thoughtsTokenCount": 1500, "toolUsePromptTokenCount": 40, "totalTokenCount": 14040}
    expected = Usage(input=4040, cache_read=8000, output=500, reasoning=1500)
    assert Usage.from_gemini(rest) == expected
    sdk = SimpleNamespace(prompt_token_count=12000, cached_content_token_count=8000, candidates_token_count=500,
                          thoughts_token_count=1500, tool_use_prompt_token_count=40, total_token_count=14040)
    assert Usage.from_gemini(sdk) == expected
    # every token of totalTokenCount is in exactly one class
    assert sum(dataclasses.astuple(expected)) - expected.requests == rest["totalTokenCount"]
    assert Usage.from_gemini({"promptTokenCount": 7}) == Usage(input=7)


def test_an_overlap_larger_than_its_total_is_refused() -> None:
    with pytest.raises(ValueError, match="cached_tokens"):
        Usage.from_openai({"prompt_tokens": 5, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 6}})
    with pytest.raises(ValueError, match="reasoning_tokens"):
        Usage.from_openai({"input_tokens": 5, "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 2}})
    with pytest.raises(ValueError, match="cached_content_token_count"):
        Usage.from_gemini({"promptTokenCount": 1, "cachedContentTokenCount": 2})


@pytest.mark.parametrize("bad", [1.0, -1, True, "3"])
def test_a_count_that_is_no_token_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        Usage.from_anthropic({"input_tokens": bad, "output_tokens": 1})
    with pytest.raises(ValueError):
        Usage(input=bad)  # type: ignore[arg-type]


def test_asdict_is_the_object_the_routines_take() -> None:
    assert dataclasses.asdict(Usage(input=3, output=4)) == {
        "input": 3, "cache_read": 0, "cache_write_5m": 0, "cache_write_1h": 0,
        "output": 4, "reasoning": 0, "requests": 1,
    }


def test_the_driver_reports_the_classes_with_tokens() -> None:
    """What the driver sends (and a request keeps): a missing class is 0 and a missing
    ``requests`` 1, so the classes not used are left out; ``asdict`` prices alike."""
    assert Usage(input=3, output=4).reported() == {"input": 3, "output": 4}
    assert Usage(cache_read=5, requests=2).reported() == {"cache_read": 5, "requests": 2}
    assert Usage(requests=0).reported() == {"requests": 0}
    assert Usage().reported() == {}
