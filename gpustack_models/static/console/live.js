// The console's numbers refresh in place: every few seconds the page is fetched again and each element
// marked data-live is replaced by its newer copy; the page itself is never reloaded.
(function () {
  "use strict";
  var EVERY_MS = 2000;
  window.consoleLoadedAt = window.consoleLoadedAt || Date.now();
  window.consoleRefreshes = 0;

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var next = fresh.querySelector('[data-live="' + el.getAttribute("data-live") + '"]');
      if (next && next.innerHTML !== el.innerHTML) {
        el.innerHTML = next.innerHTML;
      }
    });
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
    if (document.querySelector("[data-live]")) {
      setTimeout(tick, EVERY_MS);
    }
  });
})();
