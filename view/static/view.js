// redline view: filters apply when a choice changes; the run list and a run's page follow running runs live.
"use strict";

document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
  select.addEventListener("change", function () { select.form.submit(); });
});

(function followRunningRuns() {
  var table = document.getElementById("runs");
  if (!table || !table.querySelector("tr[data-state='running']")) return;
  var ids = Array.prototype.map.call(table.querySelectorAll("tr[data-id]"), function (row) {
    return "id=" + encodeURIComponent(row.dataset.id);
  }).join("&");  // this page's runs only
  function refresh() {
    fetch("/api/runs?" + ids, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data || !data.runs) return;
        var stillRunning = false;
        data.runs.forEach(function (run) {
          var row = table.querySelector("tr[data-id='" + CSS.escape(run.id) + "']");
          if (!row) return;
          if (row.dataset.state === "running" && run.state !== "running") { window.location.reload(); return; }
          var state = row.querySelector("[data-field='state']");
          state.textContent = run.state;
          state.className = "badge " + run.state;
          row.dataset.state = run.state;
          if (run.wall_s !== null) row.querySelector("[data-field='wall']").textContent = run.wall_s.toFixed(1) + " s";
          var progress = row.querySelector("[data-field='progress']");
          if (progress) progress.textContent = run.progress && run.state === "running" ? run.progress.text : "";
          if (run.state === "running") stillRunning = true;
        });
        if (stillRunning) window.setTimeout(refresh, 3000);
      })
      .catch(function () { window.setTimeout(refresh, 10000); });
  }
  window.setTimeout(refresh, 3000);
})();

(function followThisRun() {
  var line = document.getElementById("progress");
  var state = document.getElementById("state");
  if (!line || !state || state.textContent !== "running") return;
  function refresh() {
    fetch("/api/runs?id=" + encodeURIComponent(line.dataset.run), {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        var run = data && data.runs && data.runs.find(function (r) { return r.id === line.dataset.run; });
        if (!run) { window.setTimeout(refresh, 10000); return; }
        if (run.progress) {
          line.textContent = run.progress.text + (run.progress.updated ? " · saved " + run.progress.updated.slice(0, 19).replace("T", " ") : "");
        }
        state.textContent = run.state;
        state.className = "badge " + run.state;
        if (run.state === "running") window.setTimeout(refresh, 3000);
      })
      .catch(function () { window.setTimeout(refresh, 10000); });
  }
  window.setTimeout(refresh, 3000);
})();
