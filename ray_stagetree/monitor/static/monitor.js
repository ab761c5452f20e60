// The monitor's page: polls api/state (and api/curves) and draws every figure
// as inline SVG. No library, nothing from the network, no build step.
"use strict";

const poll = Number(document.body.dataset.pollMs) || 2000;
const SVG = "http://www.w3.org/2000/svg";
let sortKey = "latest";  // a trial's last result ranks it, as Tune's get_best_result (scope "last")
let sortAscending = true;
let userSorted = false;  // until a header is clicked, the best trials come first
let state = null;
let drawnState = null;  // the state last drawn, less its "updated" time
const selection = new Set();  // trials clicked in the table, for the curves

// -- small helpers -------------------------------------------------------------

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function number(value) {
  return value === null || value === undefined ? "" : Number(value).toPrecision(5);
}

function short(value) {
  if (value === null || value === undefined) return "";
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  return Math.abs(n) >= 1e4 || (Math.abs(n) < 1e-3 && n !== 0) ? n.toExponential(2) : String(Number(n.toPrecision(4)));
}

function configText(config) {
  return Object.entries(config).map(([key, value]) => `${key}=${value}`).join("  ");
}

function el(parent, name, attributes, text) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  parent.append(node);
  return node;
}

function clear(svg, height) {
  svg.replaceChildren();
  if (height) svg.setAttribute("height", height);
  return svg;
}

function message(svg, text) {
  clear(svg, 60);
  el(svg, "text", {x: 10, y: 30, class: "empty"}, text);
}

// A linear or log scale from [low, high] to [from, to].
function scale(low, high, from, to, log) {
  if (log) { low = Math.log10(low); high = Math.log10(high); }
  if (!(high > low)) { const pad = Math.abs(low) * 0.05 || 0.5; low -= pad; high += pad; }
  const f = (v) => from + ((log ? Math.log10(v) : v) - low) / (high - low) * (to - from);
  f.ticks = (count) => {
    if (log) {
      const out = [];
      for (let e = Math.floor(low); e <= Math.ceil(high); e++) if (e >= low - 1e-9 && e <= high + 1e-9) out.push(10 ** e);
      return out.length >= 2 ? out : [10 ** low, 10 ** high];
    }
    const step0 = (high - low) / count, mag = 10 ** Math.floor(Math.log10(step0));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0);
    const out = [];
    for (let v = Math.ceil(low / step) * step; v <= high + step * 1e-9; v += step) out.push(Number(v.toPrecision(10)));
    return out;
  };
  return f;
}

// Axes for a plot in svg: returns {x, y} scales; draws ticks and labels.
function axes(svg, box, xs, ys, labels, logY) {
  const width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
  const left = 64, right = width - 16, top = 12, bottom = height - 36;
  const x = scale(xs[0], xs[1], left, right, false), y = scale(ys[0], ys[1], bottom, top, logY);
  const g = el(svg, "g", {class: "axes"});
  el(g, "line", {x1: left, x2: right, y1: bottom, y2: bottom});
  el(g, "line", {x1: left, x2: left, y1: top, y2: bottom});
  for (const t of x.ticks(6)) {
    el(g, "line", {x1: x(t), x2: x(t), y1: bottom, y2: bottom + 4});
    el(g, "text", {x: x(t), y: bottom + 16, "text-anchor": "middle"}, short(t));
  }
  for (const t of y.ticks(5)) {
    el(g, "line", {x1: left - 4, x2: right, y1: y(t), y2: y(t), class: "grid"});
    el(g, "text", {x: left - 6, y: y(t) + 4, "text-anchor": "end"}, short(t));
  }
  el(g, "text", {x: (left + right) / 2, y: height - 4, "text-anchor": "middle", class: "label"}, labels[0]);
  el(g, "text", {x: 12, y: (top + bottom) / 2, transform: `rotate(-90 12 ${(top + bottom) / 2})`, "text-anchor": "middle", class: "label"}, labels[1]);
  return {x, y, left, right, top, bottom};
}

function extent(values) {
  const finite = values.filter((v) => v !== null && v !== undefined && Number.isFinite(v));
  return finite.length ? [Math.min(...finite), Math.max(...finite)] : [0, 1];
}

// Colour of a metric value: green (best) through yellow to red (worst), by the study's mode.
function colourer(values) {
  const [low, high] = extent(values);
  return (value) => {
    if (value === null || value === undefined) return "#bbb";
    let good = high > low ? (value - low) / (high - low) : 1;
    if (state.mode !== "max") good = 1 - good;
    const hue = 5 + 125 * good;  // red 5 -> green 130
    return `hsl(${hue.toFixed(0)}, 70%, 42%)`;
  };
}

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

// -- trials table ----------------------------------------------------------------

function sortValue(trial, key) {
  if (key === "config") return configText(trial.config);
  const value = trial[key];
  return value === null || value === undefined ? null : value;
}

function renderTrials() {
  const body = document.querySelector("#trials tbody");
  const trials = [...state.trials].sort((a, b) => {
    const x = sortValue(a, sortKey), y = sortValue(b, sortKey);
    if (x === y) return a.name < b.name ? -1 : 1;
    if (x === null) return 1;  // trials without a value last, either way
    if (y === null) return -1;
    return (x < y ? -1 : 1) * (sortAscending ? 1 : -1);
  });
  body.replaceChildren();
  for (const trial of trials) {
    const row = body.insertRow();
    row.className = selection.has(trial.name) ? "trial selected" : "trial";
    row.dataset.name = trial.name;
    cell(row, trial.name);
    cell(row, trial.status, `status-${trial.status}`);
    cell(row, trial.iterations);
    cell(row, number(trial.latest));
    cell(row, number(trial.best));
    cell(row, configText(trial.config), "config");
    row.addEventListener("click", () => {
      if (selection.has(trial.name)) selection.delete(trial.name); else selection.add(trial.name);
      row.classList.toggle("selected", selection.has(trial.name));
      document.querySelector("input[name='curve-set'][value='selection']").checked = true;
      loadCurves();
    });
  }
  for (const th of document.querySelectorAll("#trials th")) {
    th.classList.toggle("sorted-asc", th.dataset.key === sortKey && sortAscending);
    th.classList.toggle("sorted-desc", th.dataset.key === sortKey && !sortAscending);
  }
  const running = state.trials.filter((t) => t.status === "RUNNING").length;
  document.getElementById("trial-count").textContent =
    `(${state.trials.length}${state.live ? `, ${running} running` : ""}, ${state.metric || "no metric"} ${state.mode})`;
  document.getElementById("selection-count").textContent = selection.size;
}

// -- best so far -----------------------------------------------------------------

function renderHistory() {
  const svg = document.getElementById("history");
  const points = state.history;
  const byTime = document.querySelector("input[name='history-x']:checked").value === "at" && points.every((p) => p.at !== null);
  document.getElementById("history-count").textContent = `(${points.length} trials ended, ${state.mode} ${state.metric || ""})`;
  if (!points.length) return message(svg, "no trial has ended yet");
  clear(svg, 260);
  const xOf = (p) => (byTime ? p.at : p.count);
  const ys = extent(points.flatMap((p) => [p.value, p.best]));
  const xs = byTime ? [0, Math.max(1, ...points.map(xOf))] : [0, points.length];
  const a = axes(svg, null, xs, ys, [byTime ? "seconds since the first result" : "trials ended", `${state.metric} (last result)`]);
  for (const p of points) {
    const dot = el(svg, "circle", {cx: a.x(xOf(p)), cy: a.y(p.value), r: 3.5, class: "point"});
    el(dot, "title", {}, `${p.trial}: ${short(p.value)}`);
  }
  let d = "";
  points.forEach((p, i) => {
    const px = a.x(xOf(p)), py = a.y(p.best);
    d += i === 0 ? `M${px},${py}` : `H${px}V${py}`;
  });
  d += `H${a.right}`;
  el(svg, "path", {d, class: "best-line"});
}

// -- parameter importance --------------------------------------------------------

async function loadImportance() {
  try {
    const response = await fetch("api/importance");
    renderImportance(await response.json());
  } catch (error) {
    document.getElementById("importance-method").textContent = `cannot load the importance (${error})`;
  }
}

function renderImportance(imp) {
  document.getElementById("importance-method").textContent = `Method: ${imp.method}.`;
  const box = document.getElementById("importance");
  box.replaceChildren();
  if (!imp.params.length) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = imp.reason || "nothing to rank yet";
    box.append(p);
    return;
  }
  for (const param of imp.params) {
    const row = document.createElement("div");
    row.className = "imp-row";
    row.dataset.param = param.name;
    const name = document.createElement("span");
    name.className = "imp-name";
    name.textContent = param.name;
    const bar = document.createElement("span");
    bar.className = "imp-bar";
    bar.style.width = `${Math.max(1, 100 * param.importance) * 2.4}px`;
    const value = document.createElement("span");
    value.className = "imp-value";
    value.textContent = `${(100 * param.importance).toFixed(1)}%`;
    row.append(name, bar, value);
    box.append(row);
  }
}

// -- learning curves -------------------------------------------------------------

let curvesRequest = 0;

async function loadCurves() {
  const set = document.querySelector("input[name='curve-set']:checked").value;
  const best = Math.max(1, Number(document.getElementById("curve-best").value) || 5);
  const query = set === "all" ? "all=1" : set === "selection" ? `trials=${encodeURIComponent([...selection].join(","))}` : `best=${best}`;
  const mine = ++curvesRequest;
  try {
    const response = await fetch(`api/curves?${query}`);
    const data = await response.json();
    if (mine === curvesRequest) renderCurves(data, set);
  } catch (error) {
    message(document.getElementById("curves"), `cannot load the curves (${error})`);
  }
}

function renderCurves(data, set) {
  const svg = document.getElementById("curves");
  const logWanted = document.getElementById("curve-log").checked;
  const values = data.curves.flatMap((c) => c.points.map((p) => p[1]));
  const log = logWanted && values.length > 0 && values.every((v) => v > 0);
  const what = set === "all" ? "all trials" : set === "selection" ? "the selected trials" : "the best trials by their last result";
  document.getElementById("curves-count").textContent =
    `(${data.curves.length}: ${what}${logWanted && !log ? "; log axis needs values > 0" : log ? ", log axis" : ""})`;
  svg.dataset.curves = data.curves.length;
  if (!data.curves.length) return message(svg, set === "selection" ? "click trials in the table to select them" : "no results yet");
  clear(svg, 320);
  const xs = [0, Math.max(1, ...data.curves.flatMap((c) => c.points.map((p) => p[0])))];
  const a = axes(svg, null, xs, extent(values), ["iteration", data.metric || ""], log);
  const legend = el(svg, "g", {class: "legend"});
  data.curves.forEach((curve, i) => {
    const colour = PALETTE[i % PALETTE.length];
    const d = curve.points.map(([it, v], j) => `${j ? "L" : "M"}${a.x(it).toFixed(1)},${a.y(v).toFixed(1)}`).join("");
    const path = el(svg, "path", {d, class: "curve", stroke: colour, "data-trial": curve.trial});
    el(path, "title", {}, curve.trial);
    if (i < 12) {
      el(legend, "rect", {x: a.right - 190, y: a.top + 4 + i * 14, width: 10, height: 3, fill: colour});
      el(legend, "text", {x: a.right - 176, y: a.top + 9 + i * 14}, (curve.label || curve.trial).slice(0, 28));
    }
  });
}

// -- parallel coordinates --------------------------------------------------------

function renderParallel() {
  const svg = document.getElementById("parallel");
  const {axes: params, rows} = state.parallel;
  const all = [...params.map((a) => ({...a})), {name: state.metric || "metric", kind: "number", metric: true}];
  const metricValues = rows.map((r) => r.metric);
  const [mLow, mHigh] = extent(metricValues);
  all[all.length - 1].low = mLow; all[all.length - 1].high = mHigh; all[all.length - 1].log = false;
  document.getElementById("parallel-count").textContent = `(${rows.length} trials, ${params.length} hyper-parameters)`;
  if (!rows.length) return message(svg, "no trials yet");
  clear(svg, 300);
  const width = Number(svg.getAttribute("width")), top = 30, bottom = 260;
  const gap = (width - 140) / Math.max(1, all.length - 1);
  const xOf = (i) => (all.length === 1 ? width / 2 : 70 + i * gap);
  const scales = all.map((axis) => {
    if (axis.kind === "category") {
      const n = axis.categories.length;
      return (v) => (n === 1 ? (top + bottom) / 2 : bottom - (v / (n - 1)) * (bottom - top));
    }
    return scale(axis.low, axis.high, bottom, top, axis.log);
  });
  const colour = colourer(metricValues);
  const lines = el(svg, "g", {class: "pc-lines"});
  // Worst first, so the best lines are drawn on top.
  const order = [...rows].sort((p, q) => {
    if (p.metric === null) return -1;
    if (q.metric === null) return 1;
    return state.mode === "max" ? p.metric - q.metric : q.metric - p.metric;
  });
  for (const row of order) {
    const values = [...row.values, row.metric];
    let d = "";
    values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      d += `${d ? "L" : "M"}${xOf(i).toFixed(1)},${scales[i](v).toFixed(1)}`;
    });
    const path = el(lines, "path", {d, class: "pc-line", stroke: colour(row.metric), "data-trial": row.trial});
    el(path, "title", {}, `${row.trial}: ${state.metric} ${short(row.metric)}`);
  }
  all.forEach((axis, i) => {
    const g = el(svg, "g", {class: axis.metric ? "axis metric-axis" : "axis", "data-name": axis.name});
    el(g, "line", {x1: xOf(i), x2: xOf(i), y1: top, y2: bottom});
    el(g, "text", {x: xOf(i), y: top - 12, "text-anchor": "middle", class: "label"}, axis.name + (axis.log ? " (log)" : ""));
    const ticks = axis.kind === "category" ? axis.categories.map((c, k) => [k, c]) : scales[i].ticks(4).map((t) => [t, short(t)]);
    for (const [value, text] of ticks.slice(0, 12)) {
      el(g, "text", {x: xOf(i) + 5, y: scales[i](value) + 4, class: "tick"}, String(text).slice(0, 18));
    }
  });
}

// -- worker timeline ---------------------------------------------------------------

function renderTimeline() {
  const svg = document.getElementById("timeline");
  const tl = state.timeline;
  const segments = tl.runs.reduce((n, r) => n + r.segments.length, 0);
  document.getElementById("timeline-count").textContent =
    `(${tl.workers.length} workers, ${tl.runs.length} batches, ${segments} stage runs)`;
  if (!tl.runs.length) {
    return message(svg, state.plan_saved && !tl.recorded
      ? "this study's plan was saved before batch times were recorded"
      : "no batch has run yet (a finished study's plan is saved when it ends; live with Tuner(monitor=True))");
  }
  const lane = 34, top = 10, left = 76;
  const height = top + tl.workers.length * lane + 34;
  clear(svg, height);
  const width = Number(svg.getAttribute("width")), right = width - 16, bottom = top + tl.workers.length * lane;
  const x = scale(0, Math.max(tl.end - tl.start, 1e-3), left, right, false);
  const t = (time) => x(time - tl.start);
  const laneOf = new Map(tl.workers.map((w, i) => [w, i]));
  const yOf = (worker) => top + laneOf.get(worker) * lane;
  const g = el(svg, "g", {class: "axes"});
  for (const worker of tl.workers) {
    const lg = el(svg, "g", {class: "lane", "data-worker": worker});
    el(lg, "text", {x: 6, y: yOf(worker) + lane / 2 + 4}, `worker ${worker}`);
    el(lg, "line", {x1: left, x2: right, y1: yOf(worker) + lane, y2: yOf(worker) + lane, class: "grid"});
  }
  el(g, "line", {x1: left, x2: right, y1: bottom, y2: bottom});
  for (const tick of x.ticks(8)) {
    el(g, "text", {x: x(tick), y: bottom + 14, "text-anchor": "middle"}, `${short(tick)} s`);
  }
  el(g, "text", {x: (left + right) / 2, y: bottom + 30, "text-anchor": "middle", class: "label"}, "wall time since the first batch");
  const forks = el(svg, "g", {class: "forks"});
  for (const run of tl.runs) {
    const y0 = yOf(run.worker) + 5, h = lane - 10;
    const total = run.segments.reduce((n, s) => n + (s.stop - s.start), 0) || 1;
    const span = t(run.ended) - t(run.began);
    let offset = t(run.began);
    const rg = el(svg, "g", {class: `run ${run.outcome}`, "data-batch": run.batch});
    const phases = Object.entries(run.phases || {}).filter(([, s]) => s > 0);
    const spent = phases.map(([name, s]) => `${name} ${short(s)} s`).join(", ");
    el(rg, "title", {}, `batch ${run.batch} on worker ${run.worker}: ${run.outcome}, ${short(run.ended - run.began)} s${spent ? ` (${spent})` : ""}`);
    // Where the batch's time went: a strip under it, one stretch per phase, in the order the worker met them.
    const phaseTotal = phases.reduce((n, [, s]) => n + s, 0);
    let phaseX = t(run.began);
    for (const [name, s] of phases) {
      const w = span * s / phaseTotal;
      const strip = el(rg, "rect", {x: phaseX, y: y0 + h - 3, width: Math.max(0.5, w), height: 3, class: `phase phase-${name}`});
      el(strip, "title", {}, `${name}: ${short(s)} s`);
      phaseX += w;
    }
    for (const seg of run.segments) {
      const w = Math.max(1, span * (seg.stop - seg.start) / total);
      const rect = el(rg, "rect", {x: offset, y: y0, width: w, height: h, class: "segment", "data-stages": seg.stages.join(" ")});
      el(rect, "title", {}, `${seg.stages.join(", ")} (H${seg.node} [${seg.start}, ${seg.stop}))`);
      const label = seg.stages.join(" ");
      if (w > label.length * 6) el(rg, "text", {x: offset + 3, y: y0 + h / 2 + 4, class: "seg-label"}, label);
      offset += w;
    }
    for (const [node, iteration, at] of run.checkpoints) {
      const cx = t(at), cy = y0 + h;
      const mark = el(rg, "path", {d: `M${cx},${cy - 5}L${cx + 4},${cy}L${cx},${cy + 5}L${cx - 4},${cy}Z`, class: "ckpt"});
      el(mark, "title", {}, `checkpoint of H${node} at iteration ${iteration}`);
    }
    if (run.source) {
      const sx = t(run.source.time), sy = yOf(run.source.worker) + lane / 2, ex = t(run.began), ey = y0 + h / 2;
      const mid = (sx + ex) / 2;
      el(forks, "path", {d: `M${sx},${sy}C${mid},${sy} ${mid},${ey} ${ex},${ey}`, class: `fork ${run.source.kind}`});
    }
  }
}

// -- stage tree ------------------------------------------------------------------

function stageLabel(stage) {
  const hparams = Object.entries(stage.hparams).map(([k, v]) => `${k}=${v}`).join(", ");
  return `${stage.id} ${hparams} \u00D7${stage.trials}`;
}

function renderTree() {
  const children = new Map();
  for (const stage of state.stages) {
    const key = stage.parent || "";
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(stage);
  }
  function list(parent) {
    const ul = document.createElement("ul");
    for (const stage of children.get(parent) || []) {
      const li = document.createElement("li");
      const span = document.createElement("span");
      span.className = `stage ${stage.status}`;
      span.dataset.stage = stage.id;
      span.title = `${stage.status}; iterations [${stage.start}, ${stage.stop}); ${stage.trials} trial(s) train through it`;
      span.textContent = stageLabel(stage);
      li.append(span);
      if (stage.checkpoints.length) {
        const mark = document.createElement("span");
        mark.className = "checkpoint";
        mark.textContent = stage.checkpoints.map((step) => ` \u25CF${step}`).join("");
        li.append(mark);
      }
      if (children.has(stage.id)) li.append(list(stage.id));
      ul.append(li);
    }
    return ul;
  }
  document.getElementById("tree").replaceChildren(list(""));
  renderPlan(children);
  const counts = {finished: 0, running: 0, pending: 0};
  for (const stage of state.stages) counts[stage.status] += 1;
  document.getElementById("stage-count").textContent = state.plan_saved
    ? `(${state.stages.length} stages: ${counts.finished} finished, ${counts.running} running, ${counts.pending} pending)`
    : "(the plan is saved when the study ends; start the study with Tuner(monitor=True) to see it live)";
}

// The stage tree as a picture: x the iterations, one row per leaf, each stage
// on its first leaf's row, labelled with its id, parameters and trials.
function renderPlan(children) {
  const svg = document.getElementById("plan");
  if (!state.stages.length) { clear(svg, 0); return; }
  const rows = new Map();
  let next = 0;
  function place(stage) {
    const kids = children.get(stage.id) || [];
    if (!kids.length) rows.set(stage.id, next++);
    else rows.set(stage.id, Math.min(...kids.map(place)));
    return rows.get(stage.id);
  }
  for (const root of children.get("") || []) place(root);
  const shown = Math.min(next, 60), rowH = 26, top = 8;
  const bottom = top + shown * rowH;
  clear(svg, bottom + 34);
  const width = Number(svg.getAttribute("width"));
  const horizon = Math.max(...state.stages.map((s) => s.stop));
  const x = scale(0, horizon, 20, width - 16, false);
  const g = el(svg, "g", {class: "axes"});
  el(g, "line", {x1: x(0), x2: x(horizon), y1: bottom, y2: bottom});
  for (const tick of x.ticks(10)) el(g, "text", {x: x(tick), y: bottom + 14, "text-anchor": "middle"}, short(tick));
  el(g, "text", {x: width / 2, y: bottom + 30, "text-anchor": "middle", class: "label"}, "iteration");
  const byId = new Map(state.stages.map((s) => [s.id, s]));
  for (const stage of state.stages) {
    const row = rows.get(stage.id);
    if (row === undefined || row >= shown) continue;
    const y = top + row * rowH;
    if (stage.parent && byId.has(stage.parent) && rows.get(stage.parent) < shown) {
      const py = top + rows.get(stage.parent) * rowH + rowH / 2;
      el(svg, "line", {x1: x(stage.start), x2: x(stage.start), y1: py, y2: y + rowH / 2, class: "plan-fork"});
    }
    const w = Math.max(2, x(stage.stop) - x(stage.start));
    const bar = el(svg, "g", {class: `plan-stage ${stage.status}`, "data-stage": stage.id});
    el(bar, "rect", {x: x(stage.start), y: y + 3, width: w, height: rowH - 6});
    const hparams = Object.entries(stage.hparams).map(([k, v]) => `${k}=${v}`).join(" ");
    const label = `${stage.id} ${hparams} \u00D7${stage.trials}`;
    el(bar, "title", {}, label);
    const fits = Math.floor((w - 6) / 6.2);
    if (fits > 3) el(bar, "text", {x: x(stage.start) + 3, y: y + rowH / 2 + 4}, label.length > fits ? label.slice(0, fits - 1) + "\u2026" : label);
  }
  if (next > shown) el(svg, "text", {x: 20, y: bottom - 4, class: "empty"}, `(${next - shown} more rows: see the list below)`);
}

// -- workers and sharing ----------------------------------------------------------

function renderWorkers() {
  const body = document.querySelector("#workers tbody");
  body.replaceChildren();
  if (!state.workers.length) {
    const row = body.insertRow();
    cell(row, state.live ? "no workers" : "the study is not running in this process");
    row.cells[0].colSpan = 5;
  }
  for (const worker of state.workers) {
    const row = body.insertRow();
    row.className = "worker";
    cell(row, worker.worker);
    cell(row, worker.batch === undefined ? "idle" : worker.batch);
    cell(row, (worker.stages || []).flat().join(" \u2192 "));
    cell(row, (worker.trials || []).join(", "));
    cell(row, worker.seconds === undefined ? "" : `${worker.seconds} s`);
  }
}

function renderSharing() {
  const s = state.sharing;
  let text;
  if (s.trial_by_trial === null) text = `${s.executed ?? "?"} iterations executed`;
  else if (s.partial) {
    text = `so far (partial: the study ${state.live ? "is running" : "did not finish"}): ${s.executed} iterations executed, ` +
      `${s.trial_by_trial} reached trial by trial` + (s.saving ? ` (${s.saving}\u00D7 fewer so far)` : "");
  } else {
    text = `${s.executed} iterations executed, ${s.trial_by_trial} trial by trial` + (s.saving ? ` (${s.saving}\u00D7 fewer)` : "");
  }
  document.getElementById("sharing").textContent = text;
  const live = document.getElementById("live");
  live.textContent = state.live ? "live" : "from the directory";
  live.classList.toggle("live", state.live);
}

function renderAll() {
  renderSharing();
  renderTrials();
  renderHistory();
  renderParallel();
  renderTimeline();
  renderTree();
  renderWorkers();
}

async function refresh() {
  try {
    const response = await fetch("api/state");
    const next = await response.json();
    // Redraw only what changed: a redraw replaces the rows and figures a
    // reader may be clicking (a finished study's state never changes).
    const changed = JSON.stringify({ ...next, updated: null });
    if (changed !== drawnState) {
      state = next;
      window.monitorState = state;  // for the browser test and the curious
      if (!userSorted) sortAscending = state.mode !== "max";
      renderAll();
      await Promise.all([loadCurves(), loadImportance()]);
      drawnState = changed;
    }
    document.getElementById("updated").textContent = `updated ${new Date(next.updated * 1000).toLocaleTimeString()}`;
    document.body.dataset.loaded = "true";
  } catch (error) {
    document.getElementById("updated").textContent = `cannot reach the monitor (${error})`;
  }
  setTimeout(refresh, poll);
}

for (const th of document.querySelectorAll("#trials th")) {
  th.addEventListener("click", () => {
    sortAscending = th.dataset.key === sortKey ? !sortAscending : true;
    sortKey = th.dataset.key;
    userSorted = true;
    if (state) renderTrials();
  });
}
for (const input of document.querySelectorAll("#curve-controls input")) input.addEventListener("change", loadCurves);
for (const input of document.querySelectorAll("input[name='history-x']")) input.addEventListener("change", () => state && renderHistory());
refresh();
