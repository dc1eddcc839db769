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
