"""Prometheus metrics of one router app, in its own registry (several apps can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("router_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.latency = Histogram(
            "router_request_seconds", "request latency", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tokens_in = Counter("router_prompt_tokens", "prompt tokens appended before generation", registry=r)
        self.tokens_out = Counter("router_output_tokens", "tokens sampled by engines", registry=r)
        self.turns = Counter("router_turns", "captured turns", registry=r)
        self.bridged_turns = Counter(
            "router_bridged_turns",
            "chat turns that extended a segment from its sampled tokens (--next-turn-prompt sampled), not re-rendered",
            registry=r,
        )
        self.active_sessions = Gauge("router_active_sessions", "open sessions", registry=r)
        self.segments = Counter("router_segments", "segments started, by split reason", ["reason"], registry=r)
        self.tool_parse_failures = Counter(
            "router_tool_call_parse_failures", "outputs with tool-call markup that did not parse", registry=r
        )
        self.tool_parse_failure_reasons = Counter(
            "router_tool_call_parse_failure_reasons",
            "tool-call parse failures by model family and reason (malformed | truncated)",
            ["family", "reason"],
            registry=r,
        )
        self.engine_healthy = Gauge("router_engine_healthy", "1 if the engine is healthy", ["engine"], registry=r)
        self.engine_failovers = Counter(
            "router_engine_failovers", "sessions moved off their engine (it failed or was removed)", registry=r
        )
        self._served: dict[tuple[str, int], tuple[Counter, Histogram]] = {}  # `observe`'s series

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        """One served HTTP request. Each (endpoint, status)'s series are looked up once: `labels()`
        takes a lock and builds its key on every call, on the path of every turn."""
        if (series := self._served.get((endpoint, status))) is None:
            series = self._served[endpoint, status] = (
                self.requests.labels(endpoint, str(status)),
                self.latency.labels(endpoint),
            )
        series[0].inc()
        series[1].observe(seconds)

    def tool_parse_failed(self, family: str, reason: str) -> None:
        self.tool_parse_failures.inc()
        self.tool_parse_failure_reasons.labels(family, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
