"""A webhook receiver for bench/throughput.py --webhook: answers every POST after a latency.

An asyncio server (aiohttp), in a process of its own, so that the shipped WebhookConnector's
requests cross a real HTTP connection on 127.0.0.1 and the receiver is not what limits the
drain: each request waits --latency seconds on the loop, costs no thread, and is answered 200
with the post's id as the webhook connector reads it (JSON `id`). It counts what it answered
and prints the count when stopped (SIGTERM).

    python bench/webhook_receiver.py --port 8765 --latency 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    answered = 0

    async def hook(request: web.Request) -> web.Response:
        nonlocal answered
        await request.read()
        if args.latency:
            await asyncio.sleep(args.latency)
        answered += 1
        return web.json_response({"id": request.headers.get("X-Outbox-Post-Id", "")})

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # A backlog for the sender's first burst: up to --concurrency connections at once.
        await web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096).start()
        print("ready", flush=True)
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
        await stopped.wait()
        await runner.cleanup()
        print(f"answered {answered}", flush=True)

    asyncio.run(serve())


if __name__ == "__main__":
    main()
