/* SAML HTTP-POST binding (templates/djangosaml2/post_binding_form.html): send the form at once. */
(function () {
  "use strict";
  var form = document.querySelector("form[data-autosubmit]");
  if (form) { form.submit(); }
}());
