// An identity override's form: only the fields of what the caller gets are shown (the factor,
// or the numbers of its own; none when exempt). Without JavaScript every field is shown, and
// the server ignores those of the other choices.
(function () {
  "use strict";
  const choices = document.querySelectorAll("#id_treatment input[type=radio]");
  const factor = document.querySelector(".field-factor");
  const numbers = document.querySelector(".field-rate");
  if (!choices.length || !factor || !numbers) { return; }
  const row = numbers.closest(".form-row") || numbers;

  function show() {
    const chosen = document.querySelector("#id_treatment input:checked");
    const treatment = chosen ? chosen.value : "factor";
    factor.classList.toggle("rl-hidden", treatment !== "factor");
    row.classList.toggle("rl-hidden", treatment !== "numbers");
  }
  choices.forEach((choice) => choice.addEventListener("change", show));
  show();
})();

// select2 (Django's autocomplete) names its box only by the chosen row's title: an empty caller
// picker has none. The box is named by the field's label and what it shows (the chosen caller,
// or the placeholder's words), an attribute select2 never redraws; select2 builds its box once
// jQuery is ready, at a moment of its own, so the form is watched until it has.
(function () {
  "use strict";
  const form = document.getElementById("rule-words");
  if (!form) { return; }

  function nameBoxes() {
    document.querySelectorAll("select.admin-autocomplete").forEach((select) => {
      const box = document.getElementById("select2-" + select.id + "-container");
      const label = document.querySelector("label[for='" + select.id + "']");
      if (!box || !label || box.hasAttribute("aria-labelledby")) { return; }
      label.id = label.id || select.id + "-label";
      box.setAttribute("aria-labelledby", label.id + " " + box.id);
    });
  }
  new MutationObserver(nameBoxes).observe(form.closest("form"), {childList: true, subtree: true});
  nameBoxes();
})();
