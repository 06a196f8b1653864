// corral's dashboard: keeps a server-rendered page current. Every few seconds it fetches the page's JSON (the
// same data the server rendered the page from), redraws the tables and the summary, and appends the new samples
// to the charts (uPlot, vendored). On a job's page it also follows the job's log. Plain fetch, no framework;
// text goes into the page with textContent only, never as HTML.
(function () {
  "use strict";
  var body = document.body;
  var src = body.dataset.src;
  if (!src) return;
  var root = body.dataset.root || "";
  var windowS = Number(body.dataset.window) || 3600;
  var pollMs = (Number(body.dataset.poll) || 2) * 1000;
  var since = Number(body.dataset.now) || 0;
  var charts = {}; // id -> {plot, data}
  var COLORS = ["#2b5797", "#7a4fb5", "#1d7a46", "#d9822b", "#b3261e", "#00838f"];
  var live = document.getElementById("live");

  function part(p) {
    var el;
    if (p.href !== undefined) {
      el = document.createElement("a");
      el.href = root + p.href;
    } else {
      el = document.createElement("span");
    }
    if (p.c) el.className = p.c;
    el.textContent = p.t;
    return el;
  }

  function fillCell(td, c) {
    if (typeof c === "string") {
      td.textContent = c;
    } else if (Array.isArray(c)) {
      c.forEach(function (p) {
        td.appendChild(part(p));
        td.appendChild(p.c && p.c.split(" ").indexOf("br") >= 0 ? document.createElement("br") : document.createTextNode(" "));
      });
    } else {
      td.appendChild(part(c));
    }
  }

  function fillTable(id, t) {
    var table = document.querySelector('table[data-table="' + id + '"]');
    if (!table) return;
    var tbody = document.createElement("tbody");
    if (!t.rows.length) {
      var tr = tbody.insertRow();
      var td = tr.insertCell();
      td.colSpan = t.columns.length;
      td.className = "empty";
      td.textContent = t.empty;
    }
    t.rows.forEach(function (row) {
      var tr = tbody.insertRow();
      row.forEach(function (c) { fillCell(tr.insertCell(), c); });
    });
    table.replaceChild(tbody, table.tBodies[0]);
  }

  function fillSummary(summary) {
    Object.keys(summary).forEach(function (key) {
      var dd = document.querySelector('#summary dd[data-key="' + CSS.escape(key) + '"]');
      if (dd) dd.textContent = summary[key];
    });
  }

  function chartSize(el) {
    var small = el.parentNode.classList.contains("small");
    return { width: Math.max(200, el.clientWidth - 16), height: small ? 140 : 200 };
  }

  function makeChart(id, c) {
    var grid = document.querySelector("[data-charts]");
    if (!grid) return null;
    var el = grid.querySelector('figure[data-chart="' + CSS.escape(id) + '"]');
    if (!el) {
      el = document.createElement("figure");
      el.className = "chart";
      el.dataset.chart = id;
      var cap = document.createElement("figcaption");
      cap.textContent = c.title;
      el.appendChild(cap);
      grid.appendChild(el);
    }
    var empty = document.querySelector("[data-charts-empty]");
    if (empty) empty.hidden = true;
    var series = [{}].concat(c.labels.map(function (label, i) {
      return { label: label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false };
    }));
    var size = chartSize(el);
    var opts = {
      width: size.width,
      height: size.height,
      series: series,
      scales: { x: { time: true } },
      axes: [{}, { size: 50, label: c.unit || "" }],
      legend: { live: !el.parentNode.classList.contains("small") }, // small multiples: names only, no values
      cursor: { drag: { x: false, y: false } },
    };
    var data = [c.x.slice()].concat(c.y.map(function (col) { return col.slice(); }));
    return { plot: new uPlot(opts, data, el), data: data };
  }

  function mergeChart(id, c) {
    var entry = charts[id];
    if (!entry) {
      if (!c.x.length) return;
      entry = makeChart(id, c);
      if (entry) charts[id] = entry;
      return;
    }
    if (!c.x.length) return;
    var data = entry.data;
    var last = data[0].length ? data[0][data[0].length - 1] : -Infinity;
    c.x.forEach(function (x, i) {
      if (x <= last) return; // already drawn
      data[0].push(x);
      c.y.forEach(function (col, s) { data[s + 1].push(col[i]); });
    });
    var oldest = data[0][data[0].length - 1] - windowS;
    var drop = 0;
    while (drop < data[0].length && data[0][drop] < oldest) drop++;
    if (drop) data.forEach(function (col) { col.splice(0, drop); });
    entry.plot.setData(data);
  }

  function render(d) {
    if (d.summary) fillSummary(d.summary);
    Object.keys(d.tables || {}).forEach(function (id) { fillTable(id, d.tables[id]); });
    Object.keys(d.charts || {}).forEach(function (id) { mergeChart(id, d.charts[id]); });
  }

  function status(ok, words) {
    if (!live) return;
    live.classList.toggle("stale", !ok);
    live.textContent = ok ? "live" : words;
  }

  function url(base, key, value) {
    return base + (base.indexOf("?") >= 0 ? "&" : "?") + key + "=" + encodeURIComponent(value);
  }

  function poll(first) {
    // The first fetch asks for the whole window (the page was rendered without chart data); then only what is new.
    fetch(url(src, "since", first ? 0 : since), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.href = root + "/login"; throw new Error("logged out"); }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (d) {
        render(d);
        if (d.now > since) since = d.now;
        status(true);
      })
      .catch(function (e) { status(false, "stale: " + e.message); })
      .then(function () { window.setTimeout(poll, pollMs, false); });
  }

  // A job's log: its tail first, then what comes after, until the job has ended and all of it was read.
  var log = document.getElementById("log");
  var logOffset = null;
  var LOG_KEEP = 200000; // characters kept on the page
  function followLog() {
    var at = logOffset === null ? log.dataset.log : url(log.dataset.log, "offset", logOffset);
    fetch(at, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (d) {
        var stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        if (logOffset === null) log.textContent = d.offset > 0 ? "[... earlier output not shown ...]\n" : "";
        if (d.text) {
          var text = log.textContent + d.text;
          log.textContent = text.length > LOG_KEEP ? text.slice(text.length - LOG_KEEP) : text;
        }
        logOffset = d.next_offset;
        if (stick) log.scrollTop = log.scrollHeight;
        if (!d.complete) window.setTimeout(followLog, pollMs);
      })
      .catch(function () { window.setTimeout(followLog, pollMs * 2); });
  }

  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (id) {
      var el = charts[id].plot.root.parentNode;
      charts[id].plot.setSize(chartSize(el));
    });
  });

  poll(true);
  if (log) followLog();
})();
