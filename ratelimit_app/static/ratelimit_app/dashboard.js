// Live refresh of the rate-limit dashboard: every few seconds, fetch the JSON endpoint and swap
// in the server-rendered fragments (numbers, chart, tables), without reloading the page.
(function () {
  "use strict";
  const root = document.getElementById("rl-dashboard");
  if (!root) {
    return;
  }
  const refreshMs = Math.max(1, Number(root.dataset.refreshS) || 3) * 1000;
  const status = root.querySelector("[data-status]");

  async function refresh() {
    try {
      const url = root.dataset.url + "?window=" + encodeURIComponent(root.dataset.window);
      const response = await fetch(url, {
        credentials: "same-origin",
        headers: {"Accept": "application/json"},
      });
      const type = response.headers.get("Content-Type") || "";
      if (!response.ok || !type.startsWith("application/json")) {
        throw new Error(response.ok ? "signed out?" : "HTTP " + response.status);
      }
      const data = await response.json();
      for (const [name, html] of Object.entries(data.html)) {
        const target = root.querySelector('[data-fragment="' + name + '"]');
        if (target) {
          target.innerHTML = html;  // fragments are rendered and escaped by Django templates
        }
      }
      root.dataset.generatedAt = String(data.generated_at);
      status.textContent = "Live: updated " + new Date().toLocaleTimeString();
      status.classList.remove("rl-stale");
    } catch (error) {
      status.textContent = "Live refresh failed (" + error.message + "); retrying.";
      status.classList.add("rl-stale");
    } finally {
      window.setTimeout(refresh, refreshMs);
    }
  }

  window.setTimeout(refresh, refreshMs);
}());
