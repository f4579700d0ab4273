// Group page: refresh the nodes table in place (faster while the tab is visible), keep the sort.
(function () {
  "use strict";
  var box = document.getElementById("nodes");
  var toggle = document.getElementById("autorefresh");
  if (!box) { return; }
  function delay() { return document.hidden ? 10000 : 5000; }
  function refresh() {
    if (toggle && !toggle.checked) { return schedule(); }
    fetch(box.dataset.refreshUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        // Do not replace the table while the user is tabbing through it (keyboard focus would be lost).
        if (!box.contains(document.activeElement)) { box.innerHTML = html; }
        box.dataset.refreshedAt = new Date().toISOString();
      })
      .catch(function () { /* keep the last table; next attempt follows */ })
      .finally(schedule);
  }
  function schedule() { window.setTimeout(refresh, delay()); }
  schedule();
})();
