/* Live job state on any page: elements with data-live-job="<id>" get their
   [data-live-field] children updated from the /ws/live/ WebSocket, with a polling
   fallback through the REST API (the demo's in-memory channel layer cannot reach
   the worker process, and sockets drop). No reload needed.
   A list with [data-live-counts="<url>"] (the jobs list) also keeps its per-state counts
   current: a pushed change asks that URL (the list's filters) for the counts, at most once
   a second, and its polling fallback is that one request for every row instead of one
   request per row.
   Model services the same way: elements with data-live-service="<id>" get their
   [data-live-field] children (status, ready, desired, min, max) from "service" messages on the
   same socket; their polling fallback is one request to the [data-live-services] URL. */
(function () {
  "use strict";
  var nodes = document.querySelectorAll("[data-live-job]");
  var counts = document.querySelector("[data-live-counts]");
  var services = document.querySelectorAll("[data-live-service]");
  var servicesUrl = document.querySelector("[data-live-services]");
  if (!nodes.length && !counts && !services.length) { return; }
  var pollMs = Number(document.body.dataset.livePoll || 5000);

  function apply(job) {
    document.querySelectorAll('[data-live-job="' + job.id + '"]').forEach(function (el) {
      el.dataset.state = job.state;
      el.querySelectorAll("[data-live-show]").forEach(function (s) {
        s.hidden = s.dataset.liveShow.split(" ").indexOf(job.state) < 0;
        if (s.hidden && s.type === "checkbox") { s.checked = false; }  // a finished job's bulk-stop box
      });
      el.querySelectorAll("[data-live-field]").forEach(function (f) {
        var key = f.dataset.liveField, value;
        if (key === "state") { value = job.state_display || (job.state.charAt(0).toUpperCase() + job.state.slice(1)); f.className = f.className.replace(/\bstate-\S+/g, "") + " state-" + job.state; }
        else if (key === "queue") { value = job.queue_position ? job.queue_position + " of " + job.queue_length : ""; }
        else if (!(key in job)) { return; }  // e.g. "as_of": pushed, not in the REST fallback
        else { value = job[key] == null ? "" : String(job[key]); }
        if (f.textContent !== value) { f.textContent = value; }
      });
      // A line whose live field is empty says nothing rather than a half sentence or "—"
      // (no "Place in line:" without a number, no "Why:" without a reason).
      el.querySelectorAll("[data-live-hide-empty]").forEach(function (line) {
        var f = line.querySelector("[data-live-field]");
        if (f && !f.textContent.trim()) { line.hidden = true; }
        else if (f && !line.dataset.liveShow) { line.hidden = false; }
      });
    });
  }

  function applyService(svc) {
    document.querySelectorAll('[data-live-service="' + svc.id + '"]').forEach(function (el) {
      el.dataset.status = svc.status;
      el.querySelectorAll("[data-live-field]").forEach(function (f) {
        var key = f.dataset.liveField, value;
        if (!(key in svc)) { return; }  // a replica row's job fields inside a service's block
        if (key === "status") { value = svc.status_display; f.className = f.className.replace(/\bstate-\S+/g, "") + " state-" + svc.status; }
        else { value = svc[key] == null ? "" : String(svc[key]); }
        if (f.textContent !== value) { f.textContent = value; }
      });
    });
  }

  function pollServices() {
    var ids = {};
    services.forEach(function (el) { ids[el.dataset.liveService] = true; });
    fetch(servicesUrl.dataset.liveServices + "?ids=" + Object.keys(ids).join(","),
          { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) { data.services.forEach(applyService); } })
      .catch(function () {});
  }

  function showCounts(data) {
    counts.querySelectorAll("[data-live-count]").forEach(function (li) {
      var n = data.states[li.dataset.liveCount] || 0, strong = li.querySelector("strong");
      li.hidden = !n;
      if (strong.textContent !== String(n)) { strong.textContent = String(n); }
    });
    var total = document.querySelector("[data-live-total]");
    if (total) {
      var text = " job" + (data.total === 1 ? "" : "s") +
        (total.hasAttribute("data-filtered") ? (data.total === 1 ? " matches" : " match") : "");
      var strong = total.querySelector("strong");
      if (strong.textContent !== String(data.total) || total.lastChild.textContent !== text) {
        strong.textContent = String(data.total);
        while (strong.nextSibling) { total.removeChild(strong.nextSibling); }
        total.appendChild(document.createTextNode(text));
      }
    }
  }

  var countsTimer = null;
  function refreshList() {
    countsTimer = null;
    var ids = {};
    nodes.forEach(function (el) { ids[el.dataset.liveJob] = true; });
    fetch(counts.dataset.liveCounts + "&ids=" + Object.keys(ids).join(","),
          { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) { showCounts(data); data.jobs.forEach(apply); } })
      .catch(function () {});
  }
  function refreshListSoon() { if (!countsTimer) { countsTimer = setTimeout(refreshList, 1000); } }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws;
    try { ws = new WebSocket(proto + location.host + "/ws/live/"); } catch (e) { return; }
    ws.onmessage = function (ev) {
      var msg = JSON.parse(ev.data);
      if (msg.type === "job") { apply(msg.job); if (counts) { refreshListSoon(); } }
      else if (msg.type === "service") { applyService(msg.service); }
    };
    ws.onclose = function () { setTimeout(connect, 5000); };
  }

  function poll() {
    if (services.length && servicesUrl) { pollServices(); }
    if (counts) { refreshList(); return; }
    var ids = {};
    nodes.forEach(function (el) { ids[el.dataset.liveJob] = true; });
    Object.keys(ids).forEach(function (id) {
      fetch("/api/v1/jobs/" + id + "/", { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (job) {
          if (job) { apply({ id: job.id, state: job.state, state_display: job.state_display, reason: job.reason,
                             queue_position: job.queue_position, queue_length: job.queue_length }); }
        }).catch(function () {});
    });
  }

  connect();
  setInterval(poll, pollMs);
}());
