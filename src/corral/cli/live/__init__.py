"""The live commands of ``corral``: run the server, and talk to it.

- ``corral serve``: the controller and its HTTP API in the foreground (Ctrl-C or SIGTERM stops it; job processes
  keep running and are taken back on the next start).
- ``corral submit``, ``jobs``, ``job``, ``logs``, ``wait``, ``cancel``, ``tenants``, and ``cluster`` without a
  SPEC: clients of the API.

The client commands find the server by ``--url``/``CORRAL_URL`` and the token by ``--token``/``CORRAL_TOKEN``;
whichever is not given comes from the files ``corral serve`` keeps in its state directory (``--state-dir``/
``CORRAL_STATE_DIR``, default ``.corral``): ``server.json`` and ``admin.token``. Every read command takes
``--json`` for scripts. Errors are one ``error:`` line and exit status 2, as in the rest of the CLI.

Text that users wrote (job names, commands, environment, reasons, event details, tenant names) is shown with
its control characters made visible (``\\x1b``, ``\\n``, ``\\u202e``), never sent raw: a tenant's job name must
not be able to move the admin's cursor, recolour the screen, set the terminal's title or reorder a line.
``corral logs`` is the exception: it prints the job's own output as the job wrote it.

The commands, by what a user does:

- :mod:`~corral.cli.live.serving`: ``serve``;
- :mod:`~corral.cli.live.submitting`: ``submit`` (flags, job files, the environment a job gets);
- :mod:`~corral.cli.live.inspecting`: ``jobs`` and ``job``;
- :mod:`~corral.cli.live.following`: ``logs``, ``events``, ``wait`` and ``cancel``;
- :mod:`~corral.cli.live.cluster`: ``tenants``, and ``cluster`` without a SPEC;
- :mod:`~corral.cli.live.planning`: ``export-trace``, ``whatif`` and ``whatif accuracy``;

and what they share (the API client, user text made visible, errors) in :mod:`~corral.cli.live.common`. They all
print through this package's :data:`console` and :data:`err_console`, looked up here at each print, so that
replacing one (a test's wider console) reaches every command.

Heavy imports (FastAPI, uvicorn, the controller, httpx) happen inside the commands, so ``corral simulate`` does not
pay for them; nor does it import this package (:mod:`corral.cli.main` loads it when a live command is asked for).
"""

from __future__ import annotations

import click
from rich.console import Console

from corral.cli.live.cluster import show_live_cluster, tenants
from corral.cli.live.common import make_client, safe, visible
from corral.cli.live.following import cancel, events, logs, wait
from corral.cli.live.inspecting import _job_phase, _ranks, _recent_failures, job, jobs
from corral.cli.live.planning import export_trace, whatif
from corral.cli.live.serving import serve
from corral.cli.live.submitting import _JOB_FILE_KEYS, exported_env, load_job_file, submit

console = Console()
err_console = Console(stderr=True)

LIVE_COMMANDS: tuple[click.Command, ...] = (
    serve, submit, jobs, job, logs, events, wait, cancel, tenants, export_trace, whatif
)  # fmt: skip

__all__ = [
    "LIVE_COMMANDS",
    "_JOB_FILE_KEYS",
    "_job_phase",
    "_ranks",
    "_recent_failures",
    "cancel",
    "console",
    "err_console",
    "events",
    "export_trace",
    "exported_env",
    "job",
    "jobs",
    "load_job_file",
    "logs",
    "make_client",
    "safe",
    "serve",
    "show_live_cluster",
    "submit",
    "tenants",
    "visible",
    "wait",
    "whatif",
]
