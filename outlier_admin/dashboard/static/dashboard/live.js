// Live refresh of every dashboard page (no CDN, no inline script: the CSP allows only 'self').
// Regions marked [data-live] (with an id) are refreshed in place: from their own data-refresh-url
// (a partial the view renders) or else from the same element of a fresh copy of the page. Every 5 s
// (or the largest data-live-every of the page) while the tab is visible, every 30 s when hidden, at
// once when it becomes visible again (the habit of healthchecks' dashboard). A region is left alone
// while the user works in it (keyboard focus inside, or a field with typed text), and <details> the
// user opened stay open.
(function () {
  "use strict";
  var toggle = document.getElementById("autorefresh");
  var regions = Array.prototype.slice.call(document.querySelectorAll("[data-live][id]"));
  var timer = null;
  if (!regions.length) {
    if (toggle && toggle.parentElement) { toggle.parentElement.hidden = true; }
    return;
  }
  var opts = { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } };
  // A page whose regions are costly to build (the node page's charts) asks for less with data-live-every (s).
  var every = Math.max.apply(null, regions.map(function (el) { return Number(el.dataset.liveEvery) || 5; }));
  function delay() { return document.hidden ? Math.max(30000, every * 1000) : every * 1000; }
  function busy(el) {
    var a = document.activeElement;
    if (a && a !== document.body && el.contains(a)) { return true; }
    var fields = el.querySelectorAll("input:not([type=hidden]), textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.tagName === "SELECT" ? !f.options[f.selectedIndex] || !f.options[f.selectedIndex].defaultSelected
          : (f.type === "checkbox" || f.type === "radio") ? f.checked !== f.defaultChecked : f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }
  function apply(el, html) {
    if (busy(el)) { return; }
    var open = [];
    el.querySelectorAll("details[id]").forEach(function (d) { if (d.open) { open.push(d.id); } });
    if (el.innerHTML !== html) { el.innerHTML = html; }
    open.forEach(function (id) { var d = document.getElementById(id); if (d) { d.open = true; } });
    el.dataset.refreshedAt = new Date().toISOString();
  }
  function text(r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); }
  function refresh() {
    timer = null;
    if (toggle && !toggle.checked) { return schedule(); }
    var jobs = [];
    var fromPage = [];
    regions.forEach(function (el) {
      if (el.dataset.refreshUrl) {
        jobs.push(fetch(el.dataset.refreshUrl, opts).then(text).then(function (html) { apply(el, html); }));
      } else {
        fromPage.push(el);
      }
    });
    if (fromPage.length) {
      jobs.push(fetch(window.location.href, opts).then(text).then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        fromPage.forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (fresh) { apply(el, fresh.innerHTML); }  // absent (e.g. a login page): keep what is shown
        });
      }));
    }
    // A failed fetch keeps the last content; the next attempt follows.
    Promise.allSettled(jobs).then(schedule);
  }
  function schedule() { if (timer === null) { timer = window.setTimeout(refresh, delay()); } }
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer !== null) { window.clearTimeout(timer); refresh(); }
  });
  schedule();
})();
