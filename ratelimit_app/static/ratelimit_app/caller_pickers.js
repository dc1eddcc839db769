// select2 (Django's autocomplete) names its box only by the chosen row's title: an empty caller
// picker has none. The box is named by the field's label and what it shows (the chosen caller,
// or the placeholder's words), an attribute select2 never redraws; select2 builds its box once
// jQuery is ready, at a moment of its own, so the form is watched until it has.
// Loaded with the picker (LabelledAutocompleteSelect's media, in the page's head): the
// overrides' form, the simulator; it starts once the page is parsed.
(function () {
  "use strict";

  function nameBoxes() {
    document.querySelectorAll("select.admin-autocomplete").forEach((select) => {
      const box = document.getElementById("select2-" + select.id + "-container");
      const label = document.querySelector("label[for='" + select.id + "']");
      if (!box || !label || box.hasAttribute("aria-labelledby")) { return; }
      label.id = label.id || select.id + "-label";
      box.setAttribute("aria-labelledby", label.id + " " + box.id);
    });
  }
  function start() {
    const first = document.querySelector("select.admin-autocomplete");
    const form = first && first.closest("form");
    if (!form) { return; }
    new MutationObserver(nameBoxes).observe(form, {childList: true, subtree: true});
    nameBoxes();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
