/* oncewire ui: the dashboard's only script, served by the app as /static/dashboard.js.

   Pages carry no inline script, and their Content-Security-Policy (script-src 'self') forbids
   it. What this script needs from a page it reads from the page's elements, as text: ids and
   data-* attributes the server wrote (escaped like any other attribute). No stored value is
   ever part of a script.

   - Actions: a form with data-confirm is submitted only when the person confirms its text;
     dismissing the dialog submits nothing.
   - Live refresh: a page with #live and #live-status fetches its own content again once a
     period (?fragment=1) and swaps it in, unless a control in it took the focus meanwhile;
     the status says when, or why a refresh failed. The period is #live's data-refresh-ms (the
     server's --refresh-seconds), two seconds when the attribute is missing or not a whole
     number of milliseconds from 100 to 3600000.
   - Lab: the lab page's file input sends an evidence file to /lab/render and shows the report.
*/
(function () {
  "use strict";

  var DEFAULT_MS = 2000;

  function periodOf(live) {
    var text = live.getAttribute("data-refresh-ms") || "";
    var ms = /^[0-9]+$/.test(text) ? Number(text) : NaN;
    return ms >= 100 && ms <= 3600000 ? ms : DEFAULT_MS;
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-confirm")) { return; }
    if (!window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); }
  });

  function liveRefresh() {
    var live = document.getElementById("live");
    var status = document.getElementById("live-status");
    var pause = document.getElementById("live-pause");
    if (!live || !status) { return; }
    var period = periodOf(live);
    // Paused, hidden, or a control inside the content has the focus: a form being filled in is
    // not replaced. Asked before a refresh is fetched and again before it is swapped in, so
    // what was typed while it was on its way stays.
    function held() {
      var busy = live.contains(document.activeElement) && document.activeElement !== document.body;
      return (pause && pause.checked) || document.hidden || busy;
    }
    function tick() {
      if (held()) {
        setTimeout(tick, period);
        return;
      }
      var url = new URL(window.location.href);
      url.searchParams.set("fragment", "1");
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) {
          if (!r.ok) { throw new Error("HTTP " + r.status); }
          return r.text();
        })
        .then(function (html) {
          if (held()) { return; }
          live.innerHTML = html;
          status.dataset.refreshes = String(Number(status.dataset.refreshes) + 1);
          status.textContent = "live · " + new Date().toISOString().slice(11, 19) + " UTC";
        })
        .catch(function (e) { status.textContent = "refresh failed: " + e.message; })
        .finally(function () { setTimeout(tick, period); });
    }
    setTimeout(tick, period);
  }

  function labPicker() {
    var input = document.getElementById("evidence");
    var out = document.getElementById("lab-report");
    var status = document.getElementById("lab-status");
    if (!input || !out || !status) { return; }
    input.addEventListener("change", function () {
      var file = input.files[0];
      if (!file) { return; }
      status.textContent = "reading " + file.name + " …";
      status.className = "muted";
      file.text().then(function (text) {
        return fetch("/lab/render", {
          method: "POST",
          credentials: "same-origin",
          headers: {
            "Content-Type": "application/json",
            "X-Evidence-Name": encodeURIComponent(file.name)
          },
          body: text
        });
      }).then(function (r) {
        return r.text().then(function (html) { return { ok: r.ok, html: html }; });
      }).then(function (got) {
        if (got.ok) {
          var name = document.createElement("h2");
          name.className = "evidence-name";
          name.textContent = file.name;
          out.innerHTML = got.html;  // the server's rendering, every value escaped
          out.insertBefore(name, out.firstChild);
          status.textContent = "";
        } else {
          var doc = new DOMParser().parseFromString(got.html, "text/html");
          var why = doc.getElementById("refusal");
          status.textContent = why ? why.textContent : "refused";
          status.className = "bad";
        }
      }).catch(function (e) { status.textContent = "failed: " + e.message; });
    });
  }

  liveRefresh();
  labPicker();
})();
