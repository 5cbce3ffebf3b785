// uniqjob dashboard: refresh the figures in place, and open confirmations in a dialog.
// The pages work without this script: links lead to confirmation pages with their form.
(function () {
  "use strict";
  var PERIOD = 5000; // ms between the end of one refresh and the start of the next, at least
  // A big store takes a while to read: wait twice as long as the last read took,
  // so an open page never keeps the store busy more than a third of the time.
  var took = 0;

  function readTime(doc) {
    var main = doc.querySelector("main[data-took]");
    var seconds = main ? parseFloat(main.getAttribute("data-took")) : 0;
    return isFinite(seconds) ? seconds * 1000 : 0;
  }
  var dialog = document.getElementById("confirm-dialog");
  var stamp = document.getElementById("refreshed");

  function parse(html) {
    return new DOMParser().parseFromString(html, "text/html");
  }

  function busy() {
    return (dialog && dialog.open) || document.visibilityState === "hidden";
  }

  // Swap each [data-refresh] element's content for the fresh page's: the
  // document keeps its scroll position, and nothing runs while a
  // confirmation is open.
  function refresh() {
    if (busy()) {
      return Promise.resolve();
    }
    return fetch(window.location.href, { headers: { "X-Requested-With": "fetch" }, credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        if (busy()) {
          return;
        }
        var fresh = parse(html);
        took = readTime(fresh);
        document.querySelectorAll("[data-refresh][id]").forEach(function (old) {
          var now = fresh.getElementById(old.id);
          if (now) {
            old.innerHTML = now.innerHTML;
          }
        });
        if (stamp) {
          stamp.textContent = "updated " + new Date().toLocaleTimeString();
        }
      })
      .catch(function (error) {
        if (stamp) {
          stamp.textContent = "refresh failed (" + error.message + "); retrying";
        }
      });
  }

  function loop() {
    refresh().then(function () {
      window.setTimeout(loop, Math.max(PERIOD, 2 * took));
    });
  }

  // A click on an action opens its confirmation page's section in the dialog;
  // its form posts as it would from the page itself.
  document.addEventListener("click", function (event) {
    var target = event.target instanceof Element ? event.target : null;
    var link = target && target.closest("a.action");
    if (link && dialog && typeof dialog.showModal === "function") {
      event.preventDefault();
      fetch(link.href, { credentials: "same-origin" })
        .then(function (response) { return response.text(); })
        .then(function (html) {
          var section = parse(html).getElementById("confirm") || parse(html).getElementById("error");
          if (!section) {
            window.location.href = link.href;
            return;
          }
          dialog.innerHTML = section.outerHTML;
          dialog.showModal();
        })
        .catch(function () { window.location.href = link.href; });
      return;
    }
    var cancel = target && target.closest("dialog a.cancel");
    if (cancel && dialog) {
      event.preventDefault();
      dialog.close();
    }
  });

  if (dialog) {
    dialog.addEventListener("close", function () { dialog.innerHTML = ""; });
  }
  took = readTime(document);
  window.setTimeout(loop, Math.max(PERIOD, 2 * took));
})();
