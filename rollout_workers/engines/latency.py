"""How long an inference GPU takes to serve a batch: the latency model of the simulated engine
(`engines.simulated`). Pure arithmetic; the figures and their sources are in docs/gpu.md
"Simulated engine".

One engine = one GPU running vLLM with continuous batching. Each scheduler step decodes one token
for every running request; a step with B running requests takes `max(1 / single_stream_tps,
B / peak_decode_tps)` seconds (memory-bound until the batch is large enough to reach the GPU's
peak decode throughput, which then divides among the requests). A request's prompt is prefilled
at `prefill_tps` tokens per second before its first decode step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyModel:
    name: str
    prefill_tps: float
    """Prompt tokens per second per GPU (compute-bound)."""
    single_stream_tps: float
    """Output tokens per second of one request alone (memory-bound: 1 / time per output token)."""
    peak_decode_tps: float
    """Output tokens per second of the whole GPU at saturating batch size."""

    def step_s(self, batch: int) -> float:
        """Seconds of one decode step with `batch` running requests."""
        return max(1.0 / self.single_stream_tps, max(batch, 1) / self.peak_decode_tps)

    def prefill_s(self, prompt_tokens: int) -> float:
        return prompt_tokens / self.prefill_tps

    def batch_s(self, prompt_tokens: list[int], output_tokens: list[int]) -> float:
        """Seconds to serve one lockstep batch: every prompt prefilled, then decode steps until the
        longest output is done (requests leave the batch as they finish)."""
        total = self.prefill_s(sum(prompt_tokens))
        done, remaining = 0, sorted(output_tokens)
        for i, n in enumerate(remaining):
            total += (n - done) * self.step_s(len(remaining) - i)
            done = n
        return total


MODELS: dict[str, LatencyModel] = {
    # 7-8B dense in bf16 on one H100 SXM (docs/gpu.md "Simulated engine": vLLM >= 0.6 on Llama 3.1 8B)
    "7b-h100": LatencyModel("7b-h100", prefill_tps=30_000.0, single_stream_tps=150.0, peak_decode_tps=12_500.0),
    # 1.7B dense in bf16 on one H100 SXM: the 8B figures scaled by weight bytes (docs/gpu.md)
    "1.7b-h100": LatencyModel("1.7b-h100", prefill_tps=120_000.0, single_stream_tps=350.0, peak_decode_tps=30_000.0),
}
