// The rule in words as it is typed: the form's fields are sent to the preview endpoint, which
// renders the same sentence the rules list shows (config/rule_kinds.py; a ban rule's:
// BanRule.describe), and an estimate of what a saved rule's new numbers would have done to the
// last hour's heaviest callers.
(function () {
  "use strict";
  const panel = document.getElementById("rule-words");
  if (!panel) { return; }
  const form = panel.closest("form");
  const words = document.getElementById("rule-in-words");
  const impact = document.getElementById("rule-impact");
  let timer = null;
  let latest = 0;

  function query() {
    const params = new URLSearchParams();
    for (const [name, value] of new FormData(form)) {
      if (name !== "csrfmiddlewaretoken" && typeof value === "string") { params.append(name, value); }
    }
    params.set("kind", panel.dataset.kind);
    if (panel.dataset.rule) { params.set("rule", panel.dataset.rule); }
    return params;
  }

  function refresh() {
    const asked = ++latest;
    fetch(panel.dataset.previewUrl + "?" + query().toString(), {credentials: "same-origin"})
      .then((response) => response.ok ? response.json() : null)
      .then((body) => {
        if (!body || asked !== latest) { return; }  // an older answer arriving late
        words.textContent = body.words;
        impact.textContent = body.impact || "";
        panel.dataset.shown = asked;
      })
      .catch(() => {});  // the server's own words stay shown
  }

  function soon() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 150);
  }
  form.addEventListener("input", soon);
  form.addEventListener("change", soon);
})();
