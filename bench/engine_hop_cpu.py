"""CPU per request of the router's engine hop: aiohttp's client (the router's for /generate until
`router/generate_client.py`) against a bare asyncio protocol with httptools' response parser (the
least any Python client can spend: one write, one parse), both on uvloop, to the same uvicorn
stand-in answering a fixed /generate reply over loopback. The client process's own CPU time
(user + system) per request, 16 requests in flight, each client measured `--rounds` times in
turn. Run by hand:
  .venv/bin/python bench/engine_hop_cpu.py
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys

import aiohttp
import httptools
import orjson
import uvloop

from slimeish.common.procs import ManagedProcess, free_port, wait_http

REPLY = orjson.dumps(
    {
        "text": "xxx",
        "output_ids": [1, 2, 3],
        "meta_info": {
            "output_token_logprobs": [[-0.1, 1, None], [-0.2, 2, None], [-0.3, 3, None]],
            "finish_reason": {"type": "stop"},
        },
    }
)
REQUEST = orjson.dumps(
    {"input_ids": list(range(300)), "sampling_params": {"max_new_tokens": 8}, "return_logprob": True}
)
IN_FLIGHT = 16


def serve_standin(port: int) -> None:
    import uvicorn

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(REPLY))],
            }
        )
        await send({"type": "http.response.body", "body": REPLY})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def per_request(one, requests: int) -> float:  # type: ignore[no-untyped-def]
    for _ in range(20):
        await asyncio.gather(*(one(i) for i in range(IN_FLIGHT)))
    start = cpu()
    for _ in range(requests // IN_FLIGHT):
        await asyncio.gather(*(one(i) for i in range(IN_FLIGHT)))
    return 1e6 * (cpu() - start) / (requests // IN_FLIGHT * IN_FLIGHT)


async def with_aiohttp(url: str, requests: int) -> float:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024, keepalive_timeout=4)) as client:

        async def one(_: int) -> object:
            async with client.post(
                url + "/generate", data=REQUEST, headers={"content-type": "application/json"}, timeout=timeout
            ) as response:
                return orjson.loads(await response.read())

        return await per_request(one, requests)


class Bare(asyncio.Protocol):
    """One kept-alive connection: a request written whole, the answer parsed by httptools."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.done: asyncio.Future[bytes] | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.done is not None
        self.done.set_result(b"".join(self.body))
        self.body = []

    async def post(self, host: str, body: bytes) -> bytes:
        self.done = asyncio.get_running_loop().create_future()
        head = f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        self.transport.write(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return await self.done


async def with_bare_protocol(port: int, requests: int) -> float:
    loop = asyncio.get_running_loop()
    pool = [(await loop.create_connection(Bare, "127.0.0.1", port))[1] for _ in range(IN_FLIGHT)]

    async def one(i: int) -> object:
        return orjson.loads(await pool[i].post(f"127.0.0.1:{port}", REQUEST))

    try:
        return await per_request(one, requests)
    finally:
        for conn in pool:
            conn.transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    with ManagedProcess([sys.executable, __file__, "--serve-standin", str(port)]) as standin:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=60, proc=standin.proc)  # the stand-in answers every path
        for _ in range(args.rounds):
            print(
                f"aiohttp: {uvloop.run(with_aiohttp(url, args.requests)):.0f} us/request, "
                f"bare protocol: {uvloop.run(with_bare_protocol(port, args.requests)):.0f} us/request",
                flush=True,
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-standin"]:
        serve_standin(int(sys.argv[2]))
    else:
        main()
