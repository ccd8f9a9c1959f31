// Railhook dashboard: the only script (the Content-Security-Policy allows no other).
// Everything works without it; it adds conveniences.
"use strict";

document.addEventListener("DOMContentLoaded", function () {
  // "Select all" for a list of checkboxes: <input type="checkbox" data-select-all="name">.
  document.querySelectorAll("input[data-select-all]").forEach(function (all) {
    all.addEventListener("change", function () {
      var name = all.getAttribute("data-select-all");
      document.querySelectorAll('input[type="checkbox"][name="' + name + '"]').forEach(function (box) {
        box.checked = all.checked;
      });
    });
  });

  // Forms that change something important ask first: <form data-confirm="text">.
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) {
        event.preventDefault();
      }
    });
  });

  // A page about something still in flight reloads itself: <main data-refresh-seconds="3">.
  var main = document.querySelector("[data-refresh-seconds]");
  if (main) {
    var seconds = parseInt(main.getAttribute("data-refresh-seconds"), 10);
    if (seconds > 0) {
      window.setTimeout(function () { window.location.reload(); }, seconds * 1000);
    }
  }
});
