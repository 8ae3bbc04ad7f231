// redline view: filters apply when a choice changes; the run list and a run's page follow running runs live.
"use strict";

// How often a page asks about a running run (`redline view --refresh`); with none running, 10/3 as often.
var REFRESH_MS = Number(document.body.dataset.refreshMs) || 3000;
var IDLE_MS = REFRESH_MS * 10 / 3;

document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
  select.addEventListener("change", function () { select.form.requestSubmit(); });
});

// A filter form sends only what was chosen: its empty fields stay out of the URL (a permalink stays short).
document.querySelectorAll("form#filters").forEach(function (form) {
  form.addEventListener("submit", function () {
    form.querySelectorAll("input, select").forEach(function (field) {
      if (field.type !== "checkbox" && field.value === "") field.disabled = true;
    });
  });
  window.addEventListener("pageshow", function () {  // back to this page: its fields usable again
    form.querySelectorAll("[disabled]").forEach(function (field) { field.disabled = false; });
  });
});

(function followRunningRuns() {
  // Running rows follow their runs; a run that appears (or finishes) reloads the list, unless the
  // user is choosing runs to compare: then a line says so and waits for them.
  var count = document.getElementById("runs-count");
  if (!count) return;
  var table = document.getElementById("runs");
  var rows = table ? Array.prototype.slice.call(table.querySelectorAll("tr[data-id]")) : [];
  var ids = rows.map(function (row) { return "id=" + encodeURIComponent(row.dataset.id); });
  var query = ids.concat(count.dataset.pipeline ? ["pipeline=" + encodeURIComponent(count.dataset.pipeline)] : []).join("&");
  var known = Number(count.dataset.selected);
  function busy() {
    return document.querySelector("#runs input[type=checkbox]:checked") !== null || document.activeElement.matches("input, select");
  }
  function refresh() {
    fetch("/api/runs?" + query, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data || !data.runs) { window.setTimeout(refresh, IDLE_MS); return; }
        var running = false, changed = data.selected > known;
        data.runs.forEach(function (run) {
          var row = table && table.querySelector("tr[data-id='" + CSS.escape(run.id) + "']");
          if (!row) return;
          if (row.dataset.state === "running" && run.state !== "running") changed = true;
          var state = row.querySelector("[data-field='state']");
          state.textContent = run.state;
          state.className = "badge " + run.state;
          row.dataset.state = run.state;
          if (run.wall_s !== null) row.querySelector("[data-field='wall']").textContent = run.wall_s.toFixed(1) + " s";
          var progress = row.querySelector("[data-field='progress']");
          if (progress) progress.textContent = run.progress && run.state === "running" ? run.progress.text : "";
          if (run.state === "running") running = true;
        });
        if (changed && !busy()) { window.location.reload(); return; }
        if (changed) {
          var note = document.getElementById("runs-changed");
          note.hidden = false;
          note.querySelector("span").textContent = data.selected > known ? (data.selected - known) + " new run(s)" : "a run finished";
        }
        window.setTimeout(refresh, running ? REFRESH_MS : IDLE_MS);
      })
      .catch(function () { window.setTimeout(refresh, IDLE_MS); });
  }
  window.setTimeout(refresh, rows.some(function (row) { return row.dataset.state === "running"; }) ? REFRESH_MS : IDLE_MS);
})();

(function followThisRun() {
  // A running run's page follows its progress, and reloads when the run ends (its report appears).
  var line = document.getElementById("progress");
  var state = document.getElementById("state");
  if (!state || state.textContent !== "running") return;
  var id = state.dataset.run;
  function refresh() {
    fetch("/api/runs?id=" + encodeURIComponent(id), {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        var run = data && data.runs && data.runs.find(function (r) { return r.id === id; });
        if (!run) { window.setTimeout(refresh, IDLE_MS); return; }
        if (run.state !== "running") { window.location.reload(); return; }
        if (run.progress && line) {
          line.textContent = run.progress.text + (run.progress.updated ? " · saved " + run.progress.updated.slice(0, 19).replace("T", " ") : "");
        }
        window.setTimeout(refresh, REFRESH_MS);
      })
      .catch(function () { window.setTimeout(refresh, IDLE_MS); });
  }
  window.setTimeout(refresh, REFRESH_MS);
})();

(function keys() {
  // Keyboard: "/" to the text search; j / k to the next / previous row; Enter opens that row alone.
  var table = document.getElementById("row-table");
  var current = -1;
  function rows() { return table ? table.querySelectorAll("tbody tr") : []; }
  function select(i) {
    var all = rows();
    if (!all.length) return;
    if (current >= 0 && all[current]) all[current].classList.remove("current");
    current = Math.max(0, Math.min(all.length - 1, i));
    all[current].classList.add("current");
    all[current].scrollIntoView({block: "nearest"});
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.target.matches("input, select, textarea")) return;
    var search = document.querySelector("form#filters input[name=q]") || document.querySelector("form.search-all input[name=q]");
    if (event.key === "/" && search) { event.preventDefault(); search.focus(); }
    else if (event.key === "j") select(current + 1);
    else if (event.key === "k") select(current - 1);
    else if (event.key === "Enter" && current >= 0) {
      var link = rows()[current].querySelector("a.permalink");
      if (link) window.location.href = link.href;
    }
  });
})();
