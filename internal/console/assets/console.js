// The genbox console's one script: live pages refresh their content in place, and a decision
// form is sent once (its buttons are disabled as it goes, so a double click does not repeat it;
// the server answers a repeat with who already decided in any case).
(function () {
  "use strict";
  var main = document.getElementById("main");
  var every = main && parseInt(main.getAttribute("data-live"), 10);
  if (every > 0) {
    var busy = false;
    setInterval(function () {
      var active = document.activeElement;
      if (busy || (active && main.contains(active) && /INPUT|SELECT|TEXTAREA/.test(active.tagName))) return;
      busy = true;
      fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var next = new DOMParser().parseFromString(html, "text/html").getElementById("main");
          if (!next) return;
          var live = document.getElementById("live"), nextLive = next.querySelector("#live");
          if (live && nextLive) { live.replaceWith(nextLive); } else { main.innerHTML = next.innerHTML; }
          if (!next.hasAttribute("data-live")) { every = 0; }
        })
        .catch(function () {})
        .then(function () { busy = false; });
    }, every);
  }
  document.addEventListener("submit", function (e) {
    var f = e.target;
    if (!f.hasAttribute("data-once")) return;
    if (f.getAttribute("data-sent")) { e.preventDefault(); return; }
    f.setAttribute("data-sent", "1");
    setTimeout(function () { f.querySelectorAll("button").forEach(function (b) { b.disabled = true; }); }, 0);
  });
})();
