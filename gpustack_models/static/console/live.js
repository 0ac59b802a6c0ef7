// The console's numbers refresh in place: every few seconds the page is fetched again and each element
// marked data-live is replaced by its newer copy; the page itself is never reloaded.
// An element with data-rate-of="BYTES" (a byte count the page carries) shows how fast that count grows:
// the difference between the refreshes of the last minute over the time between them, printed as the pages
// print sizes (kinds.formatting.human_bytes: "961B", "16.0Mi"), per second.
(function () {
  "use strict";
  var EVERY_MS = 2000;
  var RATE_WINDOW_MS = 60000;
  var UNITS = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
  var samples = {};
  window.consoleLoadedAt = window.consoleLoadedAt || Date.now();
  window.consoleRefreshes = 0;

  function perSecond(bytes) {
    if (bytes < 1024) {
      return Math.round(bytes) + "B/s";
    }
    var unit = "";
    for (var i = 0; i < UNITS.length; i += 1) {
      unit = UNITS[i];
      bytes /= 1024;
      if (bytes < 1024) {
        break;
      }
    }
    return bytes.toFixed(1) + unit + "/s";
  }

  function rate(el, now) {
    var key = el.id || el.getAttribute("data-rate-of");
    var bytes = Number(el.getAttribute("data-rate-of"));
    var seen = samples[key] || [];
    if (seen.length && bytes < seen[seen.length - 1].bytes) {
      seen = []; // a download finished or started over: the count fell, measure afresh
    }
    seen.push({ at: now, bytes: bytes });
    while (seen.length > 2 && now - seen[1].at >= RATE_WINDOW_MS) {
      seen.shift();
    }
    samples[key] = seen;
    var first = seen[0];
    if (seen.length < 2 || now <= first.at) {
      return;
    }
    var value = ((bytes - first.bytes) * 1000) / (now - first.at);
    el.setAttribute("data-rate", String(Math.round(value)));
    el.textContent = perSecond(value);
  }

  function rates() {
    var now = Date.now();
    document.querySelectorAll("[data-rate-of]").forEach(function (el) { rate(el, now); });
  }

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var next = fresh.querySelector('[data-live="' + el.getAttribute("data-live") + '"]');
      if (next && next.innerHTML !== el.innerHTML) {
        el.innerHTML = next.innerHTML;
      }
    });
    rates();
    window.consoleRefreshes += 1;
  }

  function tick() {
    if (document.hidden) {
      setTimeout(tick, EVERY_MS);
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "XMLHttpRequest" } })
      .then(function (r) { return r.ok && !r.redirected ? r.text() : null; })
      .then(function (text) { if (text) { swap(text); } })
      .catch(function () {})
      .then(function () { setTimeout(tick, EVERY_MS); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    rates();
    if (document.querySelector("[data-live]")) {
      setTimeout(tick, EVERY_MS);
    }
  });
})();
