// A small SVG line chart: one or more series over steps; clicking a point opens that step.
"use strict";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"];
const W = 360, H = 190, PAD = { l: 46, r: 10, t: 24, b: 22 };

function lineChart(title, series, onPoint) {
  const points = series.flatMap((s) => s.points);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title });
  svg.append(el("svg:text", { x: PAD.l, y: 15, class: "chart-title" }, title));
  if (!points.length) return svg;
  const [x0, x1] = extent(points.map((p) => p[0]));
  const [y0, y1] = extent(points.map((p) => p[1]));
  const sx = (x) => PAD.l + ((x - x0) / (x1 - x0 || 1)) * (W - PAD.l - PAD.r);
  const sy = (y) => H - PAD.b - ((y - y0) / (y1 - y0 || 1)) * (H - PAD.t - PAD.b);
  svg.append(axes(x0, x1, y0, y1));
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const d = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    svg.append(el("svg:polyline", { points: d, fill: "none", stroke: color, "stroke-width": 1.5 }));
    for (const [x, y] of s.points) {
      const dot = el("svg:circle", { cx: sx(x), cy: sy(y), r: 3, fill: color, class: "point", "data-step": x,
        on: { click: () => onPoint(x) } });
      dot.append(el("svg:title", {}, `${s.name}\nstep ${x}: ${fmt(y, 4)}`));
      svg.append(dot);
    }
    svg.append(el("svg:text", { x: W - PAD.r, y: 15 + 11 * i, "text-anchor": "end", fill: color, class: "legend" },
      s.name));
  });
  return svg;
}

function extent(values) {
  return [Math.min(...values), Math.max(...values)];
}

function axes(x0, x1, y0, y1) {
  const g = el("svg:g", { class: "axes" });
  g.append(el("svg:line", { x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b }));
  g.append(el("svg:line", { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b }));
  g.append(el("svg:text", { x: PAD.l - 4, y: PAD.t + 4, "text-anchor": "end" }, fmt(y1)));
  g.append(el("svg:text", { x: PAD.l - 4, y: H - PAD.b, "text-anchor": "end" }, fmt(y0)));
  g.append(el("svg:text", { x: PAD.l, y: H - 6 }, `step ${x0}`));
  g.append(el("svg:text", { x: W - PAD.r, y: H - 6, "text-anchor": "end" }, `step ${x1}`));
  return g;
}

// The charts of a run page: each takes the metrics.jsonl keys its test accepts.
const CHARTS = [
  ["reward", (k) => k === "rollout/reward_mean" || k === "eval/reward_mean"],
  ["response length", (k) => k === "rollout/response_length"],
  ["KL (rollout, ref)", (k) => /(^|\/)(rollout_|ref_)?kl$/.test(k)],
  ["staleness (versions)", (k) => k === "rollout/staleness_max"],
  ["segment splits by reason", (k) => k.startsWith("rollout/segments_split/")],
  ["seconds per phase", (k) => k.startsWith("time/")],
  ["loss", (k) => k === "train/loss"],
  // --tis / --icepop: the fraction of trained tokens whose weight was clipped or masked
  ["off-policy correction", (k) => k === "train/is_clip_fraction" || k === "train/is_mask_fraction"],
  ["|Δ log-prob| trainer vs engine", (k) => /^train\/rollout_logprob_abs_diff_(mean|max)$/.test(k)],
];

function runCharts(rows, onPoint) {
  const keys = [...new Set(rows.flatMap(Object.keys))].filter((k) => k !== "step").sort();
  return CHARTS.map(([title, accepts]) => {
    const series = keys.filter(accepts).map((k) => ({
      name: k, points: rows.filter((r) => typeof r[k] === "number").map((r) => [r.step, r[k]]),
    }));
    return lineChart(title, series, onPoint);
  });
}
