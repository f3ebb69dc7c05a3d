// Hash routes -> pages; a live page refreshes every few seconds; a 401 asks for the admin token.
"use strict";

const REFRESH_MS = 2000;
let timer = null;

const ROUTES = [
  [/^#?\/?$/, () => runsPage()],
  [/^#\/run\/([^/]+)$/, (m, q, live) => runPage(dec(m[1]), live)],
  [/^#\/run\/([^/]+)\/step\/(\d+)$/, (m, q) => stepPage(dec(m[1]), m[2], q)],
  [/^#\/run\/([^/]+)\/samples$/, (m, q) => searchPage(dec(m[1]), q)],
  [/^#\/run\/([^/]+)\/sample\/([^/]+)\/(\d+)$/, (m) => samplePage(dec(m[1]), dec(m[2]), m[3])],
  [/^#\/run\/([^/]+)\/sessions$/, (m, q, live) => sessionsPage(dec(m[1]), live)],
];

function dec(part) {
  return decodeURIComponent(part);
}

async function show() {
  clearInterval(timer);
  const main = document.getElementById("main");
  const [path, query] = location.hash.split("?");
  const live = (refresh) => { timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS); };
  for (const [pattern, page] of ROUTES) {
    const m = path.match(pattern);
    if (!m) continue;
    try {
      main.replaceChildren(await page(m, new URLSearchParams(query || ""), live));
    } catch (err) {
      main.replaceChildren(err instanceof Unauthorized ? loginForm() : el("p", { class: "error" }, String(err)));
    }
    main.setAttribute("data-ready", location.hash);
    return;
  }
  main.replaceChildren(el("p", { class: "error" }, `no page at ${location.hash}`));
}

function loginForm() {
  const input = el("input", { type: "password", name: "token", autocomplete: "off" });
  const note = el("p", { class: "muted" }, "This viewer is behind the router's admin token.");
  const form = el("form", { class: "login", on: { submit: async (e) => {
    e.preventDefault();
    const r = await fetch("/api/login", { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: input.value }) });
    if (r.ok) show(); else note.textContent = "wrong token";
  } } }, el("label", {}, "admin token ", input), el("button", { type: "submit" }, "open"));
  return el("section", {}, el("h1", {}, "Sign in"), note, form);
}

window.addEventListener("hashchange", show);
window.addEventListener("DOMContentLoaded", show);
