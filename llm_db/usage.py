"""What a model call used, in the price book's disjoint token classes.

``Usage`` is what ``llm.price_usage`` (and a priced settlement) takes:
``dataclasses.asdict(usage)`` is the JSON object of the SQL routines. Providers
report usage in shapes that overlap, and counting an overlap twice is the most
common billing defect there is; each ``from_*`` removes its provider's overlaps:

- OpenAI (Chat Completions and Responses): the cached tokens are *inside* the
  prompt (input) count, and the reasoning tokens *inside* the completion (output)
  count. OpenAI bills no cache writes.
- Anthropic (Messages): ``input_tokens`` holds only the uncached input; cache reads
  and writes are reported *beside* it. Writes are split by lifetime in
  ``cache_creation`` (5 minutes, 1 hour); without that split they are 5-minute
  writes, the API's default. Thinking is inside ``output_tokens`` and billed as output.
- Google Gemini: the cached tokens are *inside* the prompt count; the thoughts are
  *beside* the candidates; tool-use prompt tokens are *beside* the prompt and billed
  as input.

Each takes the provider's own object (an SDK model with attributes) or its dict
(the JSON of the HTTP API; Gemini's REST camelCase or its SDK's snake_case), and
reads a missing or None count as 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Self

__all__ = ["Usage"]


def _get(source: Any, *names: str) -> Any:
    """The first of ``names`` present on ``source`` (a mapping's key or an object's
    attribute) and not None; None when there is none."""
    for name in names:
        value = source.get(name) if isinstance(source, Mapping) else getattr(source, name, None)
        if value is not None:
            return value
    return None


def _count(source: Any, *names: str) -> int:
    """A token count of ``source`` (0 when absent); anything but a non-negative int is
    ``ValueError``: a provider's count is never a float, and guessing is how bills go wrong."""
    value = _get(source, *names) if source is not None else None
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{names[0]} is {value!r}, not a token count")
    return value


def _overlap(name: str, total: int, part_name: str, part: int) -> int:
    """``total`` less the ``part`` the provider counted inside it."""
    if part > total:
        raise ValueError(f"{part_name} ({part}) is more than the {name} ({total}) it is part of")
    return total - part


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one call by class, disjoint: ``input`` (uncached prompt),
    ``cache_read``, ``cache_write_5m``, ``cache_write_1h``, ``output`` (visible
    completion), ``reasoning`` (thinking; priced at the output rate unless the price
    lists it) and ``requests`` (calls: 1, the call itself)."""

    input: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    output: int = 0
    reasoning: int = 0
    requests: int = 1

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Usage.{field.name} must be a non-negative int, not {value!r}")

    def reported(self) -> dict[str, int]:
        """The JSON object the driver sends: the classes with tokens, and ``requests``
        unless it is 1 (a missing class is 0, a missing ``requests`` 1), so that the
        request keeps only what was used (``dataclasses.asdict`` is accepted too)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) != (1 if field.name == "requests" else 0)}

    @property
    def prompt(self) -> int:
        """The prompt's tokens, which select a price's tier: input and the cache's reads and writes."""
        return self.input + self.cache_read + self.cache_write_5m + self.cache_write_1h

    @classmethod
    def from_openai(cls, usage: Any) -> Self:
        """From an OpenAI ``usage``: Chat Completions (``prompt_tokens``,
        ``prompt_tokens_details.cached_tokens``, ``completion_tokens``,
        ``completion_tokens_details.reasoning_tokens``) or Responses (``input_tokens``,
        ``input_tokens_details.cached_tokens``, ``output_tokens``,
        ``output_tokens_details.reasoning_tokens``)."""
        if _get(usage, "prompt_tokens", "completion_tokens") is not None:
            prompt, completion = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
            cached = _count(_get(usage, "prompt_tokens_details"), "cached_tokens")
            reasoning = _count(_get(usage, "completion_tokens_details"), "reasoning_tokens")
        else:
            prompt, completion = _count(usage, "input_tokens"), _count(usage, "output_tokens")
            cached = _count(_get(usage, "input_tokens_details"), "cached_tokens")
            reasoning = _count(_get(usage, "output_tokens_details"), "reasoning_tokens")
        return cls(
            input=_overlap("prompt", prompt, "cached_tokens", cached),
            cache_read=cached,
            output=_overlap("completion", completion, "reasoning_tokens", reasoning),
            reasoning=reasoning,
        )

    @classmethod
    def from_anthropic(cls, usage: Any) -> Self:
        """From an Anthropic Messages ``usage``: ``input_tokens`` (uncached),
        ``cache_read_input_tokens``, ``cache_creation_input_tokens`` (split by
        ``cache_creation.ephemeral_5m_input_tokens`` and ``ephemeral_1h_input_tokens``
        when present) and ``output_tokens``."""
        written = _count(usage, "cache_creation_input_tokens")
        split = _get(usage, "cache_creation")
        hour = _count(split, "ephemeral_1h_input_tokens")
        five = _count(split, "ephemeral_5m_input_tokens") if split is not None else written - hour
        if split is not None and written and five + hour != written:
            raise ValueError(f"cache_creation splits {five + hour} tokens, cache_creation_input_tokens is {written}")
        return cls(
            input=_count(usage, "input_tokens"),
            cache_read=_count(usage, "cache_read_input_tokens"),
            cache_write_5m=max(five, 0),
            cache_write_1h=hour,
            output=_count(usage, "output_tokens"),
        )

    @classmethod
    def from_gemini(cls, usage_metadata: Any) -> Self:
        """From a Gemini ``usage_metadata`` (``usageMetadata`` in REST):
        ``prompt_token_count`` (cached content inside), ``cached_content_token_count``,
        ``tool_use_prompt_token_count``, ``candidates_token_count`` and
        ``thoughts_token_count`` (beside the candidates)."""
        u = usage_metadata
        prompt = _count(u, "prompt_token_count", "promptTokenCount")
        cached = _count(u, "cached_content_token_count", "cachedContentTokenCount")
        return cls(
            input=_overlap("prompt", prompt, "cached_content_token_count", cached)
            + _count(u, "tool_use_prompt_token_count", "toolUsePromptTokenCount"),
            cache_read=cached,
            output=_count(u, "candidates_token_count", "candidatesTokenCount"),
            reasoning=_count(u, "thoughts_token_count", "thoughtsTokenCount"),
        )
