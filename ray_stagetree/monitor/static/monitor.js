// Polls /api/state and renders the page; the curves image is reloaded with it.
"use strict";

const poll = Number(document.body.dataset.pollMs) || 2000;
let sortKey = "latest";  // a trial's last result ranks it, as Tune's get_best_result (scope "last")
let sortAscending = true;
let userSorted = false;  // until a header is clicked, the best trials come first
let state = null;

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function number(value) {
  return value === null || value === undefined ? "" : Number(value).toPrecision(5);
}

function configText(config) {
  return Object.entries(config).map(([key, value]) => `${key}=${value}`).join("  ");
}

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
    row.className = "trial";
    row.dataset.name = trial.name;
    cell(row, trial.name);
    cell(row, trial.status, `status-${trial.status}`);
    cell(row, trial.iterations);
    cell(row, number(trial.latest));
    cell(row, number(trial.best));
    cell(row, configText(trial.config), "config");
  }
  for (const th of document.querySelectorAll("#trials th")) {
    th.classList.toggle("sorted-asc", th.dataset.key === sortKey && sortAscending);
    th.classList.toggle("sorted-desc", th.dataset.key === sortKey && !sortAscending);
  }
  document.getElementById("trial-count").textContent = `(${state.trials.length}, ${state.metric || "no metric"} ${state.mode})`;
}

function stageLabel(stage) {
  const hparams = Object.entries(stage.hparams).map(([k, v]) => `${k}=${v}`).join(", ");
  return `H${stage.node} [${stage.start}, ${stage.stop}) ${hparams} \u00D7${stage.trials}`;
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
      span.title = `${stage.status}; ${stage.trials} trial(s) train through it`;
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
  const counts = {finished: 0, running: 0, pending: 0};
  for (const stage of state.stages) counts[stage.status] += 1;
  document.getElementById("stage-count").textContent = state.plan_saved
    ? `(${state.stages.length} stages: ${counts.finished} finished, ${counts.running} running, ${counts.pending} pending)`
    : "(the plan is saved when the study ends; start the study with Tuner(monitor=True) to see it live)";
}

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
    cell(row, (worker.segments || []).map(([node, start, stop]) => `H${node} [${start}, ${stop})`).join(" \u2192 "));
    cell(row, (worker.trials || []).join(", "));
    cell(row, worker.seconds === undefined ? "" : `${worker.seconds} s`);
  }
}

function renderSharing() {
  const s = state.sharing;
  const text = s.trial_by_trial === null
    ? `${s.executed ?? "?"} iterations executed`
    : `${s.executed} iterations executed, ${s.trial_by_trial} trial by trial` + (s.saving ? ` (${s.saving}\u00D7 fewer)` : "");
  document.getElementById("sharing").textContent = text;
  const live = document.getElementById("live");
  live.textContent = state.live ? "live" : "from the directory";
  live.classList.toggle("live", state.live);
  document.getElementById("updated").textContent = `updated ${new Date(state.updated * 1000).toLocaleTimeString()}`;
}

async function refresh() {
  try {
    const response = await fetch("api/state");
    state = await response.json();
    if (!userSorted) sortAscending = state.mode !== "max";
    renderSharing();
    renderTrials();
    renderTree();
    renderWorkers();
    document.getElementById("curves").src = `curves.svg?t=${Date.now()}`;
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
refresh();
