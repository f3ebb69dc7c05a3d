import json

from fastapi import FastAPI
from fastapi.responses import Response

from slimeish.common.sample import Sample
from slimeish.router.metrics import RouterMetrics
from slimeish.train.metrics import MetricsLogger, RouterCounters, batch_metrics
from tests.stand_in import serve_app


def test_jsonl_tensorboard_console_and_plot(tmp_path):
    log = MetricsLogger(tmp_path)
    line = log.log(0, {"rollout/reward_mean": 0.25, "train/loss": 1.5, "skip": float("nan")})
    log.log(1, {"rollout/reward_mean": 0.75, "eval/reward_mean": 0.5})
    assert "reward=0.25" in line and "loss=1.5" in line
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 0, "rollout/reward_mean": 0.25, "train/loss": 1.5}
    assert any((tmp_path / "tensorboard").iterdir())
    png = log.plot_rewards()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log.close()


def test_resume_drops_rows_past_the_checkpoint(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(4):
        log.log(step, {"rollout/reward_mean": step})
    resumed = MetricsLogger(tmp_path, tensorboard=False, keep_before=2)
    resumed.log(2, {"rollout/reward_mean": 9.0})
    assert [(r["step"], r["rollout/reward_mean"]) for r in resumed.read()] == [(0, 0.0), (1, 1.0), (2, 9.0)]


def test_router_counters_report_increments_since_the_last_read():
    # The router's own metrics object, served as its /metrics endpoint serves it.
    metrics = RouterMetrics()
    app = FastAPI()
    app.get("/metrics")(lambda: Response(metrics.render(), media_type="text/plain"))
    metrics.tool_parse_failures.inc(2)
    with serve_app(app) as url:
        counters = RouterCounters(url)  # what happened before the run's first step is not counted
        metrics.tool_parse_failed("qwen3", "malformed")
        metrics.turns.inc(7)
        metrics.bridged_turns.inc(5)
        metrics.segments.labels("first").inc()
        metrics.segments.labels("assistant_edited").inc(2)
        zero = {"router/tool_parse_failures": 0.0, "router/turns": 0.0, "router/bridged_turns": 0.0}
        step = {"router/tool_parse_failures": 1.0, "router/turns": 7.0, "router/bridged_turns": 5.0}
        labelled = {"router/parse_failures/qwen3/malformed": 1.0, "router/splits/assistant_edited": 2.0}
        assert counters.delta() == step | labelled  # a first segment is no split
        assert counters.delta() == zero | dict.fromkeys(labelled, 0.0)


def test_router_counters_sum_over_the_runs_routers():
    def served(metrics: RouterMetrics) -> FastAPI:
        app = FastAPI()
        app.get("/metrics")(lambda: Response(metrics.render(), media_type="text/plain"))
        return app

    routers = [RouterMetrics(), RouterMetrics()]
    with serve_app(served(routers[0])) as first, serve_app(served(routers[1])) as second:
        counters = RouterCounters(first, second)
        routers[0].turns.inc(3)
        routers[1].turns.inc(4)
        assert counters.delta()["router/turns"] == 7.0


def test_batch_metrics_count_splits_by_reason_and_sampled_tokens():
    def sample(mask, reason=None):
        return Sample(tokens=[1] * (2 + len(mask)), response_length=len(mask), loss_mask=mask, reward=1.0,
                      weight_versions=[3], split_reason=reason)  # fmt: skip

    batch = [sample([1, 1, 0, 1]), sample([1, 1], "history_rewritten"), sample([1], "history_rewritten")]
    m = batch_metrics(batch, version=4)
    assert m["rollout/sampled_tokens"] == 6 and m["rollout/staleness_max"] == 1
    assert m["rollout/segments_split"] == 2 and m["rollout/segments_split/history_rewritten"] == 2
