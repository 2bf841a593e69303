/* Form behaviour without inline handlers (the Content-Security-Policy allows no inline script):
   <select data-autosubmit> submits its form on change; <form data-confirm="question"> asks first. */
(function () {
  "use strict";
  document.addEventListener("change", function (e) {
    var el = e.target;
    if (el && el.matches && el.matches("select[data-autosubmit]") && el.form) { el.form.submit(); }
  });
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { e.preventDefault(); }
  });
}());
