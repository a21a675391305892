// Live updates (server-sent events from the lifecycle topic), the pause button, and the
// token field of a dashboard started with --token. No build step, no framework.
"use strict";
(function () {
  const kind = document.body.dataset.live;  // "list", "run" or ""
  const state = document.getElementById("live-state");
  const toggle = document.getElementById("live-toggle");
  let paused = false, missed = 0, timer = null, loading = false, again = false;

  // --token: the user types it once; every form of the page sends it.
  const tokenInput = document.getElementById("token-input");
  if (tokenInput) {
    tokenInput.value = sessionStorage.getItem("runstream-token") || "";
    const fill = () => {
      sessionStorage.setItem("runstream-token", tokenInput.value);
      document.querySelectorAll("input.token-field").forEach((f) => { f.value = tokenInput.value; });
    };
    tokenInput.addEventListener("input", fill);
    document.addEventListener("submit", fill, true);
    fill();
  }

  if (!kind || !window.EventSource) { state.parentElement.hidden = true; return; }
  const target = kind === "list" ? "runs-table" : "run-body";
  const runId = kind === "run" ? document.getElementById("run-title").dataset.run : null;

  // One fetch at a time: changes that come while one is under way make one more after it.
  function refresh() {
    timer = null;
    if (loading) { again = true; return; }
    loading = true;
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    url.searchParams.delete("done");
    fetch(url).then((r) => (r.ok ? r.text() : null)).then((html) => {
      if (html !== null && !paused) { document.getElementById(target).innerHTML = html; }
    }).catch(() => {}).finally(() => {
      loading = false;
      if (again) { again = false; changed(); }
    });
  }
  function changed() {
    if (paused) { missed += 1; state.textContent = `paused (${missed} changes)`; return; }
    if (timer === null) { timer = setTimeout(refresh, 300); }
  }
  // From the events read before this page's data: a change in between is not missed.
  const source = new EventSource(`/events?since=${document.body.dataset.since || ""}`);
  source.onmessage = (msg) => {
    const ev = JSON.parse(msg.data);
    if (runId === null || ev.run_id === runId) { changed(); }
  };
  source.onerror = () => { state.textContent = paused ? state.textContent : "reconnecting"; };
  source.onopen = () => { if (!paused) { state.textContent = "live"; } };
  toggle.addEventListener("click", () => {
    paused = !paused;
    toggle.textContent = paused ? "Resume" : "Pause";
    state.textContent = paused ? "paused" : "live";
    if (!paused && missed) { missed = 0; refresh(); }
  });
})();
