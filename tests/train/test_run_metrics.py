import json

from slimeish.run_metrics import MetricsLogger


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
