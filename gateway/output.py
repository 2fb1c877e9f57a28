"""Per-request output assembly: token ids in, text deltas out.

One `OutputAssembler` per generated sequence. It owns the incremental detokenizer and the stop
matcher, counts tokens and records when each arrived (for TTFT/ITL), and decides the finish
reason: the backend's (`stop` on EOS, `length` at max_tokens) or `stop` when a stop string
matched in the text — then the caller must abort the request on its backend.

Without a decode function (`decode=None`) the text comes with the tokens: a backend that
detokenizes for the gateway (an HTTP server the gateway has no tokenizer for) sends each chunk's
text, and stop strings are matched in it the same way.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.detokenizer import Decode, IncrementalDetokenizer, StopMatcher


@dataclass(slots=True)
class OutputDelta:
    """What one batch of tokens adds to the response."""

    text: str
    token_ids: list[int]
    logprobs: list[tuple] | None  # (logprob, top ids, top logprobs) per token
    finish_reason: str | None  # None while the sequence goes on


class OutputAssembler:
    __slots__ = (
        "_detok",
        "_min_tokens",
        "_stop",
        "_stop_ids",
        "finish_reason",
        "logprobs",
        "stopped_by_string",
        "text",
        "token_ids",
        "token_times",
    )

    def __init__(self, decode: Decode | None, prompt_ids: Sequence[int], stop: Sequence[str],
                 include_stop: bool = False, min_tokens: int = 0,
                 stop_token_ids: Sequence[int] = ()) -> None:
        self._detok = IncrementalDetokenizer(decode, prompt_ids) if decode is not None else None
        self._stop_ids = frozenset(stop_token_ids)  # EOS (unless ignored) and stop_token_ids
        self._stop = StopMatcher(stop, include_stop)
        self._min_tokens = min_tokens
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[tuple] = []
        self.token_times: list[float] = []
        self.finish_reason: str | None = None
        self.stopped_by_string = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token_ids: Sequence[int], now: float, finish_reason: str | None = None,
            logprobs: Sequence[tuple] | None = None, text: str | None = None) -> OutputDelta:
        """Tokens from one StepOutput (possibly none, with only a finish reason); `text`: their
        text, when the backend detokenizes (the assembler has no decode function).

        A step that accepted draft tokens (speculative decoding) brings several tokens; with stop
        strings they are matched one token at a time, as decoding them one per step would be, so
        that the output ends at the token that completes a stop string (and min_tokens counts
        per token): the tokens after it, and their logprobs, are dropped (the caller aborts the
        request on its backend, which frees their KV)."""
        if self.finished:
            return OutputDelta("", [], None, None)
        ids = list(token_ids)
        lps = list(logprobs) if logprobs is not None and len(logprobs) == len(ids) else None
        if len(ids) > 1 and self._detok is not None and self._stop.active:
            delta_text = self._feed_step(ids, finish_reason)
        else:
            delta_text = self._feed(ids, finish_reason, text)
        if lps is not None:
            del lps[len(ids):]
            self.logprobs.extend(lps)
        self.token_times.extend([now] * len(ids))
        self.text += delta_text
        return OutputDelta(delta_text, ids, lps, self.finish_reason)

    def _feed_step(self, ids: list[int], finish_reason: str | None) -> str:
        """Several tokens of one step with stop strings: fed whole where that gives what one
        token at a time gives, at a third of the cost (no stop string ends in them, all their
        text came out, min_tokens not reached inside them, not the last step), else one token
        at a time from where the step began; `ids` is cut after the token that completed the
        stop. (Text held back whole, "D" + half of "😀", would hide a stop that a token at a
        time sees: "END" completed by "D".)"""
        before = len(self.token_ids)
        # per token, token i is matched once before + i + 1 >= min_tokens: all or none alike?
        if finish_reason is None and (self._min_tokens <= before + 1
                                      or self._min_tokens > before + len(ids)):
            marks = self._detok.mark(), self._stop.mark()
            text = self._feed(ids, None, None)
            if not self._stop.stopped and not self._detok.pending:
                return text
            self._detok.rewind(marks[0])
            self._stop.rewind(marks[1])
            del self.token_ids[before:]
            self.stopped_by_string, self.finish_reason = False, None
        parts = []
        for i, tok in enumerate(ids):
            parts.append(self._feed([tok], finish_reason if i == len(ids) - 1 else None, None))
            if self.finished:
                del ids[i + 1:]
                break
        return "".join(parts)

    def _feed(self, ids: list[int], finish_reason: str | None, text: str | None) -> str:
        """Count `ids`, detokenize them, match stop strings; the text they add."""
        self.token_ids.extend(ids)
        # no stop string ends the output before min_tokens tokens (vLLM's rule)
        match = self._stop.feed if len(self.token_ids) >= self._min_tokens else self._stop.skip
        # the token that stopped the backend (EOS, a stop token id) is not part of the text
        text_ids = ids[:-1] if finish_reason == "stop" and ids and ids[-1] in self._stop_ids \
            else ids
        detok = self._detok
        text = match(detok.add(text_ids) if detok is not None else text or "")
        if self._stop.stopped:
            self.stopped_by_string = True
            self.finish_reason = "stop"
        elif finish_reason is not None:
            text += self._stop.feed(detok.flush() if detok is not None else "")
            if self._stop.stopped:
                self.stopped_by_string = True
                self.finish_reason = "stop"
            else:
                text += self._stop.flush()
                self.finish_reason = finish_reason
        return text

    @property
    def tpot(self) -> float | None:
        t = self.token_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None
