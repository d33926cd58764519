// jobcore console: confirm destructive actions, refresh the overview, keyboard shortcuts.
"use strict";
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.dataset && form.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

// "/" jumps to the job search box, as in most consoles.
document.addEventListener("keydown", (event) => {
  const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName);
  if (event.key === "/" && !typing) {
    const box = document.getElementById("q");
    if (box) { event.preventDefault(); box.focus(); }
  }
});

// The overview's live part: fetched again every few seconds and swapped in place.
const live = document.getElementById("live");
if (live) {
  const refresh = async () => {
    try {
      const response = await fetch(live.dataset.live, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (response.ok && !response.redirected) live.innerHTML = await response.text();
    } catch (_) { /* the next round tries again */ }
  };
  setInterval(refresh, Number(live.dataset.interval) || 5000);
}
