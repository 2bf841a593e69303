/* Copy buttons: <button data-copy="input-id"> copies that input's value (the clipboard API;
   a selected input and execCommand where it is missing, e.g. plain-HTTP deployments) and says
   so in the element marked data-copied="input-id". */
(function () {
  "use strict";
  function said(id, text) {
    var out = document.querySelector('[data-copied="' + id + '"]');
    if (out) { out.textContent = text; }
  }
  document.addEventListener("click", function (ev) {
    var button = ev.target.closest("button[data-copy]");
    if (!button) { return; }
    var id = button.getAttribute("data-copy");
    var input = document.getElementById(id);
    if (!input) { return; }
    function fallback() {
      input.select();
      said(id, document.execCommand && document.execCommand("copy") ? "Copied" : "Select and copy it");
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(input.value).then(function () { said(id, "Copied"); }, fallback);
    } else {
      fallback();
    }
  });
}());
