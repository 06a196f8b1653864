"""The web dashboard of ``corral serve``: the cluster, the tenants, the queue, each job and the scheduler, as pages
served by the same process and port as the API (``/``, ``/tenants``, ``/queue``, ``/jobs/ID``, ``/scheduler``).

Server-rendered Jinja2 templates, so that every table is there with JavaScript off; a little vanilla JavaScript
(``static/dashboard.js``) polls each page's JSON every 2 s to keep the tables current and to draw the last hour
as charts with uPlot, vendored under ``static/vendor/uplot`` (MIT): every asset ships in the package and nothing
is fetched from the network. People log in with a token (the admin's or a tenant's) and get a server-side
session; a tenant sees what the API shows it and nothing more (docs/live.md, "Dashboard").

- :mod:`.routes`: the routes, added to the API's app by :func:`add_dashboard`;
- :mod:`.pages`: what each page shows, as data (the same for the HTML and the JSON);
- :mod:`.cells`: that data's cells, tables and charts, and the HTML of table rows;
- :mod:`.sessions`: login sessions;
- :mod:`.history`: the time series of the last hour, sampled by a thread of the server process.
"""

from corral.live.dashboard.routes import Dashboard, add_dashboard

__all__ = ["Dashboard", "add_dashboard"]
