"""slime's rollout machinery under slime's names, as its fully-async rollout uses it:
`generate_and_rm(_group)` (slimeish.rollout.sglang_rollout), `slimeish.utils.async_utils.run`,
`get_rollout_num_engines` and `args.sglang_server_concurrency`."""

import asyncio
import json
import threading

from slimeish.common.sample import Sample
from slimeish.rollout import sglang_rollout
from slimeish.rollout.sglang_rollout import GenerateState, generate_and_rm_group
from slimeish.train.setup import parse_args, plugin_args
from slimeish.utils.async_utils import run
from slimeish.utils.http_utils import get_rollout_num_engines

HERE = __name__


async def length_reward(args, sample):
    return float(sample.response_length)


def _args(tmp_path, model, *extra):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    setup = parse_args(["--model-path", str(model), "--prompt-data", str(data), *extra])
    return plugin_args(setup, "http://127.0.0.1:9", "t")


def test_run_keeps_one_background_loop_for_every_caller():
    async def where():
        return asyncio.get_running_loop(), threading.current_thread().name

    seen = [run(where())]
    worker = threading.Thread(target=lambda: seen.append(run(where())))
    worker.start()
    worker.join()
    (loop_a, thread_a), (loop_b, thread_b) = seen
    assert loop_a is loop_b and thread_a == thread_b == "slime-async-loop"


def test_engines_and_per_engine_concurrency_give_the_rollout_concurrency(tmp_path):
    args = _args(tmp_path, tmp_path, "--num-engines", "2", "--rollout-concurrency", "5")
    assert get_rollout_num_engines(args) == 2 and args.sglang_server_concurrency == 3
    args = _args(tmp_path, tmp_path, "--engine-url", "http://a:1", "http://b:1", "http://c:1")
    assert get_rollout_num_engines(args) == 3


def test_generate_and_rm_group_generates_on_the_router_and_scores_each_member(tmp_path, tiny_model, monkeypatch):
    args = _args(tmp_path, tiny_model, "--custom-rm-path", f"{HERE}.length_reward", "--rollout-max-response-len", "3")
    posted = []

    async def engine(url, body):  # the router's root /generate, answering as SGLang does
        posted.append((url, body))
        n = len(posted)
        meta = {"weight_version": "4", "finish_reason": {"type": "length"},
                "output_token_logprobs": [[-0.5, 7, None]] * n}  # fmt: skip
        return {"text": "x" * n, "output_ids": [7] * n, "meta_info": meta}

    monkeypatch.setattr(sglang_rollout, "post", engine)
    group = [Sample(prompt="hi", index=i) for i in range(2)]
    out = run(generate_and_rm_group(args, group, GenerateState(args).sampling_params))
    ids = GenerateState(args).tokenizer.encode("hi")
    assert [url for url, _ in posted] == ["http://127.0.0.1:9/generate"] * 2
    assert all(body["input_ids"] == ids and body["sampling_params"]["max_new_tokens"] == 3 for _, body in posted)
    assert sorted((s.response_length, s.reward) for s in out) == [(1, 1.0), (2, 2.0)]
    assert all(s.tokens[: len(ids)] == ids and s.weight_versions == [4] and s.rollout_log_probs for s in out)
    assert all(s.status == Sample.Status.TRUNCATED for s in out)
