/* Live log pane: a [data-log-follow="<url>"] section follows a workload's logs through
   the API's Server-Sent Events (GET …/logs/?follow=true). The stream starts with each
   pod's last lines, which replace what the page was rendered with; new lines are
   appended (the pane keeps its last MAX_LINES and stays scrolled to the bottom if it was).
   The stream is bounded in time: at its end the pane says so instead of reconnecting. */
(function () {
  "use strict";
  var MAX_LINES = 2000;
  document.querySelectorAll("[data-log-follow]").forEach(function (section) {
    if (!window.EventSource) { return; }
    var status = section.querySelector("[data-log-status]");
    var fresh = {};
    var es = new EventSource(section.dataset.logFollow, { withCredentials: true });

    function pane(pod) {
      var pre = section.querySelector('pre[data-pod="' + CSS.escape(pod) + '"]');
      if (!pre) {
        var empty = section.querySelector("[data-log-empty]");
        if (empty) { empty.remove(); }
        var h = document.createElement("h3");
        var code = document.createElement("code");
        code.textContent = pod;
        h.appendChild(code);
        pre = document.createElement("pre");
        pre.className = "mono log";
        pre.dataset.pod = pod;
        section.appendChild(h);
        section.appendChild(pre);
      }
      return pre;
    }

    function say(text) { if (status) { status.textContent = text; } }

    es.addEventListener("open", function () { say("live"); });
    es.addEventListener("log", function (ev) {
      var msg = JSON.parse(ev.data);
      var pre = pane(msg.pod);
      if (!fresh[msg.pod]) { fresh[msg.pod] = true; pre.textContent = ""; }
      var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode(msg.line + "\n"));
      while (pre.childNodes.length > MAX_LINES) { pre.removeChild(pre.firstChild); }
      if (atBottom) { pre.scrollTop = pre.scrollHeight; }
    });
    es.addEventListener("end", function (ev) {
      es.close();
      say("stopped: " + JSON.parse(ev.data).reason + " (reload to follow again)");
    });
    es.onerror = function () { es.close(); say("live updates interrupted (reload to follow again)"); };
  });
}());
