"""Build and run a live server: a configuration becomes a controller, the controller an HTTP API, and uvicorn
serves it on a socket the caller bound (``corral serve`` is the command-line face of :func:`serve`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from corral.live.config import ServeConfig, remove_server_file, write_server_file
from corral.live.records import ClusterSnapshot
from corral.live.store import JobEvent


def serve(
    config: ServeConfig,
    sock: socket.socket,
    on_ready: Callable[[ClusterSnapshot], None],
    on_events: Callable[[list[JobEvent]], None] | None = None,
) -> None:
    """Start the controller, serve its API on ``sock`` until uvicorn stops, then stop the controller (the job
    processes keep running: the next start takes them back). ``on_ready`` is told the cluster once the server
    file is written, before the first request is served; ``on_events`` each turn's job events, once committed
    (from the restart's on)."""
    import uvicorn

    from corral.live.api import create_app
    from corral.live.controller import Controller

    controller = Controller.from_config(config)
    controller.on_events = on_events
    pid = os.getpid()
    try:
        controller.start()
        app = create_app(controller)
        snapshot = controller.cluster()
        write_server_file(config, config.url, pid)
        on_ready(snapshot)
        # lifespan: the dashboard's history thread starts and stops with the app (corral.live.dashboard.history)
        server = uvicorn.Server(
            uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", lifespan="on")
        )
        server.run(sockets=[sock])
    finally:
        controller.stop()
        remove_server_file(config, pid)
