/* Live job state on any page: elements with data-live-job="<id>" get their
   [data-live-field] children updated from the /ws/live/ WebSocket, with a polling
   fallback through the REST API (the demo's in-memory channel layer cannot reach
   the worker process, and sockets drop). No reload needed. */
(function () {
  "use strict";
  var nodes = document.querySelectorAll("[data-live-job]");
  if (!nodes.length) { return; }
  var pollMs = Number(document.body.dataset.livePoll || 5000);

  function apply(job) {
    document.querySelectorAll('[data-live-job="' + job.id + '"]').forEach(function (el) {
      el.dataset.state = job.state;
      el.querySelectorAll("[data-live-show]").forEach(function (s) {
        s.hidden = s.dataset.liveShow.split(" ").indexOf(job.state) < 0;
      });
      el.querySelectorAll("[data-live-field]").forEach(function (f) {
        var key = f.dataset.liveField, value;
        if (key === "state") { value = job.state_display || (job.state.charAt(0).toUpperCase() + job.state.slice(1)); f.className = f.className.replace(/\bstate-\S+/g, "") + " state-" + job.state; }
        else if (key === "queue") { value = job.queue_position ? job.queue_position + " of " + job.queue_length : ""; }
        else { value = job[key] == null ? "" : String(job[key]); }
        if (f.textContent !== value) { f.textContent = value; }
      });
    });
  }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws;
    try { ws = new WebSocket(proto + location.host + "/ws/live/"); } catch (e) { return; }
    ws.onmessage = function (ev) {
      var msg = JSON.parse(ev.data);
      if (msg.type === "job") { apply(msg.job); }
    };
    ws.onclose = function () { setTimeout(connect, 5000); };
  }

  function poll() {
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
