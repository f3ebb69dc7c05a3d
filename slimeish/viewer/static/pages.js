// The pages. Each returns a node (and may start a refresh timer through `live`).
"use strict";

const enc = encodeURIComponent;
const runHref = (rid) => `#/run/${enc(rid)}`;
const stepHref = (rid, step) => `${runHref(rid)}/step/${step}`;
const sampleHref = (rid, sid, seg) => `${runHref(rid)}/sample/${enc(sid)}/${seg}`;
const FILTERS = ["min_reward", "max_reward", "status", "split_reason", "parse_failure", "min_length", "max_length"];
const failuresText = (failures) => Object.entries(failures).map(([reason, n]) => `${reason} ×${n}`).join(", ");

async function runsPage() {
  const runs = await getJSON("/api/runs");
  const rows = runs.map((r) => [link(runHref(r.run_id), r.run_id), r.run_dir || "–",
    fmt(r.stats.sessions_finished), fmt(r.stats.groups_trained), link(`${runHref(r.run_id)}/sessions`, "in flight")]);
  return el("section", {}, el("h1", {}, "Runs"),
    runs.length ? table(["run", "run dir", "sessions finished", "groups trained", "sessions"], rows)
      : el("p", { class: "muted" }, "no runs found"));
}

async function runPage(rid, live) {
  const charts = el("div", { class: "charts" });
  const steps = el("div", { id: "steps" });
  let rows = [];
  const refresh = async () => {
    const after = rows.length ? rows[rows.length - 1].step : -1;
    const fresh = await getJSON(`/api/runs/${enc(rid)}/metrics?after=${after}`);
    if (fresh.length || !rows.length) {
      rows = rows.concat(fresh);
      charts.replaceChildren(...runCharts(rows, (step) => { location.hash = stepHref(rid, step); }));
      steps.replaceChildren(stepTable(rid, await getJSON(`/api/runs/${enc(rid)}/steps`)));
    }
  };
  await refresh();
  live(refresh);
  return el("section", {}, el("h1", {}, `Run ${rid}`),
    el("p", {}, link(`${runHref(rid)}/sessions`, "sessions in flight"), " · ",
      link(`${runHref(rid)}/samples`, "find samples")),
    charts, el("h2", {}, "Steps"), steps);
}

function stepTable(rid, steps) {
  const cols = ["rollout/reward_mean", "eval/reward_mean", "rollout/response_length", "rollout/staleness_max",
    "rollout/segments_split", "episodes/regenerated", "train/loss"];
  const heads = ["reward", "held-out reward", "response length", "staleness", "splits", "regenerated", "loss"];
  return table(["step", "groups", ...heads],
    steps.map((s) => [link(stepHref(rid, s.step), String(s.step)), fmt(s.groups), ...cols.map((c) => fmt(s[c]))]));
}

function filterForm(params, onApply) {
  const inputs = FILTERS.map((name) => el("label", {}, name.replace("_", " "),
    el("input", { name, value: params.get(name) || "", size: 8 })));
  const form = el("form", { class: "filters", on: { submit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const input of form.querySelectorAll("input")) if (input.value) q.set(input.name, input.value);
    onApply(q);
  } } }, inputs, el("button", { type: "submit" }, "filter"));
  return form;
}

async function stepPage(rid, step, params) {
  const data = await getJSON(`/api/runs/${enc(rid)}/steps/${step}?${params}`);
  const form = filterForm(params, (q) => { location.hash = `${stepHref(rid, step)}?${q}`; });
  return el("section", {}, el("h1", {}, `Run ${rid} · step ${step}`), form,
    data.groups.length ? data.groups.map((g) => groupCard(rid, g)) : el("p", { class: "muted" }, "no matching samples"));
}

// A harness episode's record (docs/harness.md), stored in its finish metadata: "harness" is its
// outcome, "harness_lost" the infrastructure failures it was regenerated after.
function episodeCell(finish) {
  const h = finish.harness;
  if (!h) return "–";
  const lost = finish.harness_lost || [];
  return el("span", { class: `outcome ${h.kind}`, title: h.reason || "" }, `${h.task}: ${h.kind}`,
    lost.length ? el("span", { class: "regenerated" },
      ` · regenerated ${lost.length}× (${lost.map((x) => x.kind).join(", ")})`) : null);
}

function harnessPanel(finish) {
  const h = finish.harness;
  if (!h) return null;
  const lost = finish.harness_lost || [];
  const facts = [["task", h.task], ["outcome", h.kind], ["reason", h.reason || "–"], ["agent exit", fmt(h.agent_exit)],
    ["grader exit", fmt(h.grader_exit)], ["timings (s)", Object.entries(h.timings).map(([k, v]) => `${k} ${v}`).join(", ")],
    ["regenerated", lost.length ? lost.map((x) => `${x.kind}: ${x.reason}`).join("; ") : "never"]];
  const block = (title, text) => el("details", { class: "harness-output" }, el("summary", {}, title),
    el("pre", { class: "json" }, text || "(empty)"));
  return el("div", { class: "harness" }, el("h2", {}, "Harness episode"),
    el("dl", { class: "facts" }, facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))])),
    block("patch", h.patch), block("grader output", h.grader_output), block("agent output", h.agent_output));
}

function groupCard(rid, g) {
  const rows = g.members.map((m) => [String(m.index), m.session_id, el("span", { class: `status ${m.status}` }, m.status),
    fmt(m.reward), fmt(m.advantage), episodeCell(m.finish_metadata), m.segments.map((s) => el("div", {},
      link(sampleHref(rid, m.session_id, s.segment_index), `segment ${s.segment_index}`),
      ` · ${s.response_length} tokens · v${s.weight_versions.join(",")}`,
      s.split_reason ? el("span", { class: "split" }, ` split: ${s.split_reason}`) : null,
      Object.keys(s.parse_failures).length
        ? el("span", { class: "parse-failure" }, ` tool call did not parse: ${failuresText(s.parse_failures)}`) : null))]);
  return el("div", { class: "group" },
    el("h3", {}, `group ${g.group_id}`, el("span", { class: "muted" }, ` ${g.state} · size ${g.size}` +
      (g.reopened ? ` · reopened ${g.reopened}×` : ""))),
    table(["index", "session", "status", "reward", "advantage (GRPO)", "episode", "samples"], rows));
}

async function searchPage(rid, params) {
  const form = filterForm(params, (q) => { location.hash = `${runHref(rid)}/samples?${q}`; });
  const data = await getJSON(`/api/runs/${enc(rid)}/samples?${params}`);
  const rows = data.rows.map((r) => [link(stepHref(rid, r.step), String(r.step)), r.group_id, String(r.index),
    link(sampleHref(rid, r.session_id, r.segment_index), `${r.session_id}/${r.segment_index}`), r.status,
    fmt(r.reward), fmt(r.advantage), String(r.response_length), r.split_reason || "–",
    failuresText(r.parse_failures) || "–"]);
  return el("section", {}, el("h1", {}, `Run ${rid} · samples`), form,
    el("p", { class: "muted" }, `${data.rows.length}${data.truncated ? "+ (first shown)" : ""} samples`),
    table(["step", "group", "index", "sample", "status", "reward", "advantage", "length", "split", "parse failure"],
      rows));
}

async function samplePage(rid, sid, seg) {
  const s = await getJSON(`/api/runs/${enc(rid)}/samples/${enc(sid)}/${seg}`);
  const facts = [["group", s.group_id], ["index", s.index], ["status", s.status], ["reward", fmt(s.reward)],
    ["weight versions", s.weight_versions.join(", ")], ["split reason", s.split_reason || "– (first segment)"],
    ["prompt tokens", s.prompt_length], ["response tokens", s.response_length]];
  return el("section", {}, el("h1", {}, `Sample ${sid} · segment ${seg}`),
    el("dl", { class: "facts" }, facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))])),
    harnessPanel(s.session.finish_metadata), legend(), el("div", { id: "turns" }, s.turns.map((t) => turnBlock(s, t))),
    el("h2", {}, "Session metadata"), el("pre", { class: "json" }, JSON.stringify(s.session.metadata, null, 2)),
    el("h2", {}, "Finish metadata"), el("pre", { class: "json" }, JSON.stringify(s.session.finish_metadata, null, 2)));
}

function legend() {
  return el("p", { class: "legend-row" }, el("span", { class: "tok prompt" }, "prompt"), " ",
    el("span", { class: "tok given" }, "template / tool / user (not trained)"), " ",
    el("span", { class: "tok sampled" }, "sampled (loss_mask 1)"), " · underline: probability of the sampled token ",
    el("span", { class: "heat-scale" }), " · hover a token for its log-prob");
}

function turnBlock(s, t) {
  const tokens = el("div", { class: "tokens" });
  for (let i = t.start; i < t.end; i++) tokens.append(tokenSpan(s, i));
  return el("div", { class: "turn" },
    el("h3", {}, `turn ${t.turn_index}`, el("span", { class: "muted" },
      ` · weights v${t.weight_versions.join(",")} · ${t.finish_reason} · ${t.engine} · ${t.seconds}s`)),
    tokens,
    t.parse_failure ? el("div", { class: "parse-failure" },
      `tool call did not parse: ${t.parse_failure} (the agent got the text as content)`) : null,
    t.tool_results.length ? el("div", { class: "tools" }, el("b", {}, "tool results"),
      t.tool_results.map((x) => el("pre", {}, x))) : null,
    t.tool_calls.length ? el("div", { class: "tools" }, el("b", {}, "tool calls"),
      t.tool_calls.map((x) => el("pre", {}, x))) : null);
}

function tokenSpan(s, i) {
  const origin = i < s.prompt_length ? "prompt" : s.sampled[i] ? "sampled" : "given";
  const lp = s.logprobs[i];
  const title = lp === null ? `token ${s.tokens[i]}` : `token ${s.tokens[i]}\nlogprob ${lp.toFixed(4)} (p=${Math.exp(lp).toFixed(3)})`;
  const span = el("span", { class: `tok ${origin}`, "data-i": i, title }, s.text[i]);
  if (lp !== null) span.style.borderBottomColor = `hsl(${Math.round(120 * Math.exp(lp))}, 80%, 40%)`;
  return span;
}

async function sessionsPage(rid, live) {
  const body = el("div", {});
  const refresh = async () => {
    const d = await getJSON(`/api/runs/${enc(rid)}/sessions`);
    const engines = d.engines ? table(["engine", "healthy", "in flight", "sessions", "weight version", "refused"],
      d.engines.map((e) => [e.url, String(e.healthy), fmt(e.inflight), fmt(e.sessions), fmt(e.weight_version),
        e.refused || "–"])) : el("p", { class: "muted" }, `router: ${d.router_error}`);
    const now = Date.now() / 1000;
    const open = table(["session", "group", "index", "turns", "age (s)", "engine", "segments"],
      d.open.map((o) => [o.session_id, o.group_id, String(o.index), String(o.n_turns), fmt(now - o.created_at, 3),
        o.router ? o.router.engine || "–" : "–",
        o.router ? o.router.segments.map((x) => `${x.index}:${x.num_tokens}${x.split_reason ? ` (${x.split_reason})` : ""}`).join(" ") : "–"]));
    body.replaceChildren(el("h2", {}, "Engines"), engines, el("h2", {}, `Open sessions (${d.open.length})`), open);
  };
  await refresh();
  live(refresh);
  return el("section", {}, el("h1", {}, `Run ${rid} · sessions in flight`), body);
}
