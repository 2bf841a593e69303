/* Dashboard charts (Chart.js, served from static/vendor). Data comes from a json_script tag. */
(function () {
  "use strict";
  var el = document.getElementById("chart-data");
  if (!el || typeof Chart === "undefined") { return; }
  var data = JSON.parse(el.textContent);
  var palette = ["#2f6fde", "#e07a1f", "#2a9d5b", "#b23a48", "#7b5ea7", "#1b998b", "#c9a227"];
  function labels(times) {
    times = times || [];
    var span = times.length ? new Date(times[times.length - 1]) - new Date(times[0]) : 0;
    return times.map(function (t) {
      var d = new Date(t);
      return span < 864e5 ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
                          : d.toLocaleDateString([], { month: "short", day: "numeric" }) + " " +
                            d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    });
  }
  function line(canvas, times, sets, yTitle) {
    new Chart(canvas, {
      type: "line",
      data: { labels: labels(times), datasets: sets.map(function (s, i) {
        return { label: s.label, data: s.data, borderColor: palette[i % palette.length],
                 backgroundColor: palette[i % palette.length], pointRadius: 0, tension: 0.2, spanGaps: true };
      }) },
      options: { responsive: true, maintainAspectRatio: false, animation: false,
                 interaction: { mode: "index", intersect: false },
                 scales: { x: { ticks: { maxTicksLimit: 6 } }, y: { beginAtZero: true, title: { display: !!yTitle, text: yTitle } } } }
    });
  }
  document.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
    var kind = canvas.dataset.chart;
    if (kind === "tenants") {
      var t = data.tenants || { at: [], tenants: {} };
      line(canvas, t.at, Object.keys(t.tenants).map(function (name) { return { label: name, data: t.tenants[name] }; }), "GPUs");
      return;
    }
    var c = data.clusters[Number(canvas.dataset.cluster)] || {};
    if (kind === "alloc") {
      line(canvas, c.at, [{ label: "allocated %", data: c.allocated || [] }, { label: "utilization %", data: c.utilization || [] }], "%");
    } else if (kind === "queue") {
      line(canvas, c.at, [{ label: "queued", data: c.queued || [] }, { label: "running", data: c.running || [] }], "jobs");
    } else if (kind === "wait") {
      line(canvas, c.at, [{ label: "p50", data: c.wait_p50 || [] }, { label: "p95", data: c.wait_p95 || [] }], "seconds");
    }
  });
}());
