// tinkrl view: learning curves, a rollout browser and eval results over the JSON API of
// tinkrl/viewer/server.py. Plain DOM and the vendored uPlot; polls the API for live runs.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#57606a"];
const state = {
  sources: [],
  metrics: {},          // source id -> {rows, warm_start}
  selectedRuns: null,   // Set of source ids shown on the curves page
  selectedMetrics: null,
  charts: [],
  chartKey: "",
  episodes: null,       // {source, step, episodes}
  selectedEpisode: null,
  evalData: null,
  selectedTrial: null,
};

const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
const fmt = (v) => (v === null || v === undefined ? "-" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(3)) : String(v));

async function api(path) {
  const r = await fetch(path, {cache: "no-store"});
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

// ---------- pages ----------
function showPage() {
  const page = (location.hash || "#curves").slice(1);
  for (const sec of document.querySelectorAll(".page")) sec.classList.toggle("active", sec.id === page);
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === `tab-${page}`);
  refresh();
}

const runs = () => state.sources.filter((s) => s.kind === "run");
const evals = () => state.sources.filter((s) => s.kind === "eval");

// ---------- curves ----------
function defaultMetric(key) {
  return /^env\/[^/]+\/reward\/total$/.test(key) || /^eval\/.*(reward|correct)/.test(key) ||
    key === "optim/kl_sample_train_v1" || key === "optim/entropy";
}

function metricKeys() {
  const keys = new Set();
  for (const id of state.selectedRuns) for (const row of state.metrics[id]?.rows ?? [])
    for (const [k, v] of Object.entries(row)) if (k !== "step" && (typeof v === "number" || v === null)) keys.add(k);
  return [...keys].sort();
}

function renderRunList() {
  const box = $("#run-list");
  box.innerHTML = runs().map((s) =>
    `<label><input type="checkbox" data-run="${s.id}" ${state.selectedRuns.has(s.id) ? "checked" : ""}>
     ${esc(s.name)} <span class="tag">${esc(s.model ?? "")}</span></label>`).join("") ||
    `<div class="empty">no run directories</div>`;
  for (const cb of box.querySelectorAll("input")) cb.onchange = () => {
    const id = Number(cb.dataset.run);
    cb.checked ? state.selectedRuns.add(id) : state.selectedRuns.delete(id);
    state.chartKey = "";
    refresh();
  };
}

function renderMetricList(keys) {
  const filter = $("#metric-filter").value.trim();
  const box = $("#metric-list");
  box.innerHTML = keys.filter((k) => !filter || k.includes(filter)).map((k) =>
    `<label><input type="checkbox" data-metric="${esc(k)}" ${state.selectedMetrics.has(k) ? "checked" : ""}> ${esc(k)}</label>`).join("");
  for (const cb of box.querySelectorAll("input")) cb.onchange = () => {
    cb.checked ? state.selectedMetrics.add(cb.dataset.metric) : state.selectedMetrics.delete(cb.dataset.metric);
    state.chartKey = "";
    renderCharts();
  };
}

// one chart: x = step, one series per (run, key)
function chartData(series) {
  const steps = new Set();
  for (const s of series) for (const row of state.metrics[s.run]?.rows ?? []) if (row[s.key] != null) steps.add(row.step);
  const xs = [...steps].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = series.map((s) => {
    const y = new Array(xs.length).fill(null);
    for (const row of state.metrics[s.run]?.rows ?? []) if (row[s.key] != null && index.has(row.step)) y[index.get(row.step)] = row[s.key];
    return y;
  });
  return [xs, ...ys];
}

// a flat series (all values equal) gets a unit band around it instead of uPlot's 0..100
function yRange(u, min, max) {
  if (min == null || max == null) return [0, 1];
  const pad = min === max ? Math.max(Math.abs(min) * 0.1, 0.5) : (max - min) * 0.05;
  return [min - pad, max + pad];
}

// one chart under #charts: data = [xs, ...one ys per label]; `id` is its data-metric attribute
function drawChart(id, title, xLabel, labels, data) {
  const div = document.createElement("div");
  div.className = "chart";
  div.dataset.metric = id;
  div.innerHTML = `<h4>${esc(title)}</h4>`;
  $("#charts").appendChild(div);
  if (data[0].length === 0) {
    div.insertAdjacentHTML("beforeend", `<div class="empty">no values yet</div>`);
    return;
  }
  const opts = {
    width: Math.max(420, div.clientWidth - 16), height: 220,
    scales: {x: {time: false}, y: {range: yRange}},
    axes: [{label: xLabel}, {}],
    series: [{label: xLabel}, ...labels.map((label, i) => ({
      label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, points: {show: data[0].length < 40},
    }))],
  };
  state.charts.push(new uPlot(opts, data, div));
}

// a metric of metrics.jsonl per step, one series per (run, key)
function addChart(title, series) {
  drawChart(title, title, "step", series.map((s) => s.label), chartData(series));
}

function renderCharts() {
  const ids = [...state.selectedRuns];
  const key = JSON.stringify([ids, [...state.selectedMetrics], ids.map((id) => state.metrics[id]?.rows.length)]);
  if (key === state.chartKey) return;
  state.chartKey = key;
  for (const c of state.charts) c.destroy();
  state.charts = [];
  $("#charts").innerHTML = "";
  const name = (id) => state.sources.find((s) => s.id === id)?.name ?? id;
  for (const k of [...state.selectedMetrics].sort())
    addChart(k, ids.map((id) => ({run: id, key: k, label: name(id)})));
  // the step's time split: sampling vs training, per run
  const split = ids.flatMap((id) => ["time/sample", "time/train"].map((k) => ({run: id, key: k, label: `${name(id)} ${k.slice(5)}`})));
  addChart("time split (s): sample / train", split);
  const warm = ids.filter((id) => (state.metrics[id]?.warm_start ?? []).some((r) => r["sft/nll"] != null));
  if (warm.length) renderWarmStart(warm, name);
}

function renderWarmStart(ids, name) {
  // supervised warm-start steps (warm_start.jsonl): loss per step, their own x axis
  const sft = (id) => state.metrics[id].warm_start.filter((r) => r["sft/nll"] != null);
  const xs = [...new Set(ids.flatMap((id) => sft(id).map((r) => r.sft_step)))].sort((a, b) => a - b);
  const ys = ids.map((id) => xs.map((x) => sft(id).find((r) => r.sft_step === x)?.["sft/nll"] ?? null));
  drawChart("warm_start/sft_nll", "warm start: supervised NLL per token", "sft step", ids.map(name), [xs, ...ys]);
}

async function refreshCurves() {
  if (state.selectedRuns === null) state.selectedRuns = new Set(runs().map((s) => s.id));
  renderRunList();
  await Promise.all([...state.selectedRuns].map(async (id) => { state.metrics[id] = await api(`api/metrics?source=${id}`); }));
  const keys = metricKeys();
  if (state.selectedMetrics === null || (state.selectedMetrics.size === 0 && keys.length)) {
    state.selectedMetrics = new Set(keys.filter(defaultMetric));
  }
  renderMetricList(keys);
  renderCharts();
}

// ---------- transcripts (episodes and eval trials) ----------
function highlight(text, query) {
  const safe = esc(text);
  if (!query) return safe;
  const q = esc(query).replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return safe.replace(new RegExp(q, "gi"), (m) => `<mark>${m}</mark>`);
}

function messageHtml(m, query) {
  const role = m.role || "unknown";
  let body = typeof m.content === "string" ? m.content : m.content == null ? "" : JSON.stringify(m.content, null, 1);
  let html = `<div class="msg role-${esc(role)}"><div class="role">${esc(role)}${m.name ? " · " + esc(m.name) : ""}</div>`;
  if (body) html += `<pre>${highlight(body, query)}</pre>`;
  for (const call of m.tool_calls ?? []) {
    const fn = call.function ?? {};
    html += `<div class="tool-call">→ ${esc(fn.name ?? call.name)}(${highlight(typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? call.arguments), query)})</div>`;
  }
  return html + "</div>";
}

function transcriptHtml(ep, query) {
  const fields = [
    ["env", ep.env], ["step", ep.step], ["group", ep.group], ["episode", ep.episode], ["task", ep.task],
    ["reward", ep.reward], ["advantage", ep.advantage], ["trained", ep.source === "train" ? ep.trained : null],
    ["turns", ep.turns], ["action tokens", ep.ac_tokens], ["prompt tokens", ep.ob_tokens || null],
    ["truncated", ep.truncated], ["end", ep.end || null], ["failure", ep.failure_mode],
  ].filter(([, v]) => v !== null && v !== undefined && v !== "");
  let html = `<div class="episode-head" id="episode-head">${fields.map(([k, v]) => `<div><b>${k}</b> ${esc(fmt(v))}</div>`).join("")}</div>`;
  html += ep.messages.length ? ep.messages.map((m) => messageHtml(m, query)).join("") : `<div class="empty">no transcript</div>`;
  const extra = Object.entries(ep.logs ?? {}).map(([k, v]) => `<div><b>${esc(k)}</b> ${esc(typeof v === "string" ? v : JSON.stringify(v))}</div>`).join("");
  html += `<div class="grade" id="grade"><div><b>reward</b> ${esc(fmt(ep.reward))}</div>` +
    (ep.grade ? `<div><b>grade</b> ${esc(ep.grade)}</div>` : "") +
    (ep.failure_detail ? `<div><b>failure</b> ${esc(ep.failure_detail)}</div>` : "") + extra + "</div>";
  return html;
}

function episodeText(ep) {
  return [ep.task, ep.grade, ep.failure_detail, ...ep.messages.map((m) => `${m.content ?? ""} ${JSON.stringify(m.tool_calls ?? "")}`)].join("\n").toLowerCase();
}

function episodeRowHtml(ep, selected) {
  const r = ep.reward;
  const cls = r == null ? "" : r > 0 ? "pos" : "zero";
  const tags = (ep.failure_mode ? `<span class="tag fail">${esc(ep.failure_mode)}</span>` : "") +
    (ep.truncated ? `<span class="tag trunc">truncated</span>` : "") +
    (ep.ac_tokens ? `<span class="tag">${ep.ac_tokens} tok</span>` : "");
  // in a group every episode has the group's task: the row names the attempt, its turns and how it ended
  const label = ep.source === "eval" ? `${ep.task} #${ep.episode}` : `#${ep.episode ?? "-"}`;
  return `<div class="episode-row${selected ? " selected" : ""}" data-id="${esc(ep.id)}">
    <span>${esc(label)} · ${ep.turns} turn${ep.turns === 1 ? "" : "s"}${ep.end ? " · " + esc(ep.end) : ""}</span>
    <span class="reward ${cls}">${fmt(r)}${ep.advantage != null ? ` <small>adv ${ep.advantage.toFixed(2)}</small>` : ""}</span>
    <span>${tags}</span></div>`;
}

// ---------- episodes ----------
function filteredEpisodes() {
  const env = $("#ep-env").value, reward = $("#ep-reward").value, query = $("#ep-search").value.trim().toLowerCase();
  return (state.episodes?.episodes ?? []).filter((ep) =>
    (!env || ep.env === env) &&
    (!reward || (reward === "pos" ? ep.reward > 0 : ep.reward != null && ep.reward <= 0)) &&
    (!$("#ep-failed").checked || ep.failure_mode) &&
    (!$("#ep-truncated").checked || ep.truncated) &&
    (!query || episodeText(ep).includes(query)));
}

function renderEpisodes() {
  const all = state.episodes?.episodes ?? [];
  const envs = [...new Set(all.map((e) => e.env))];
  const envSel = $("#ep-env"), current = envSel.value;
  envSel.innerHTML = `<option value="">all</option>` + envs.map((e) => `<option ${e === current ? "selected" : ""}>${esc(e)}</option>`).join("");
  const shown = filteredEpisodes();
  const groups = new Map();
  for (const ep of shown) {
    const k = `${ep.env}/${ep.group}`;
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(ep);
  }
  const rewards = all.filter((e) => e.reward != null).map((e) => e.reward);
  const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
  $("#ep-summary").innerHTML = `<div class="group-head" id="ep-count">${shown.length} of ${all.length} episodes · mean reward ${fmt(mean)} · ${all.filter((e) => e.failure_mode).length} failed · ${all.filter((e) => e.truncated).length} truncated</div>`;
  let html = "";
  for (const [k, eps] of groups) {
    const first = eps[0];
    html += `<div class="group" data-group="${esc(k)}"><div class="group-head">group ${esc(first.group)} · ${esc(first.env)} · ${esc(first.task)}${first.trained ? ' <span class="tag">trained</span>' : ""}</div>` +
      eps.map((ep) => episodeRowHtml(ep, ep.id === state.selectedEpisode)).join("") + "</div>";
  }
  $("#ep-list").innerHTML = html || `<div class="empty">no episodes match</div>`;
  for (const row of document.querySelectorAll("#ep-list .episode-row")) row.onclick = () => {
    state.selectedEpisode = row.dataset.id;
    renderEpisodes();
  };
  const ep = all.find((e) => e.id === state.selectedEpisode) ?? shown[0];
  if (ep && !state.selectedEpisode) state.selectedEpisode = ep.id;
  $("#transcript").innerHTML = ep ? transcriptHtml(ep, $("#ep-search").value.trim()) : `<div class="empty">no episode selected</div>`;
  for (const row of document.querySelectorAll("#ep-list .episode-row")) row.classList.toggle("selected", row.dataset.id === state.selectedEpisode);
}

async function refreshEpisodes() {
  const runSel = $("#ep-run");
  const chosen = runSel.value;
  runSel.innerHTML = runs().map((s) => `<option value="${s.id}">${esc(s.name)}</option>`).join("");
  if (!runs().length) return;
  // the run chosen before, else the newest one
  const newest = runs().reduce((a, b) => ((b.created ?? "") > (a.created ?? "") ? b : a));
  runSel.value = runs().some((s) => String(s.id) === chosen) ? chosen : String(newest.id);
  const source = Number(runSel.value);
  const {steps} = await api(`api/steps?source=${source}`);
  const stepSel = $("#ep-step"), chosenStep = stepSel.value;
  stepSel.innerHTML = [...steps].reverse().map((s) => `<option value="${s}">${s}</option>`).join("");
  if (!steps.length) { $("#ep-list").innerHTML = `<div class="empty">no episodes written yet</div>`; return; }
  const follow = $("#ep-follow").checked;
  const step = follow || !steps.includes(Number(chosenStep)) ? steps[steps.length - 1] : Number(chosenStep);
  stepSel.value = String(step);
  if (state.episodes?.source === source && state.episodes?.step === step) return renderEpisodes();
  const data = await api(`api/episodes?source=${source}&step=${step}`);
  state.episodes = {source, step, episodes: data.episodes};
  state.selectedEpisode = null;
  renderEpisodes();
}

// ---------- evals ----------
function renderEval() {
  const {results, trials} = state.evalData;
  const tasks = results.tasks ?? [];
  const cols = tasks.length ? Object.keys(tasks[0]) : [];
  $("#ev-meta").innerHTML = `<div class="group-head">model ${esc(results.model ?? "-")} · ${trials.length} trials</div>`;
  $("#ev-table").innerHTML = `<tr>${cols.map((c) => `<th>${esc(c)}</th>`).join("")}</tr>` +
    tasks.map((t) => `<tr class="task-row" data-task="${esc(t.task)}">${cols.map((c) => `<td>${esc(fmt(t[c]))}</td>`).join("")}</tr>`).join("") +
    (results.overall ? `<tr class="overall">${cols.map((c) => `<td>${esc(fmt(results.overall[c]))}</td>`).join("")}</tr>` : "");
  for (const tr of document.querySelectorAll("#ev-table tr.task-row")) tr.onclick = () => {
    state.selectedTrial = trials.find((t) => t.task === tr.dataset.task)?.id ?? null;
    renderEval();
  };
  $("#ev-trials").innerHTML = trials.map((t) => episodeRowHtml(t, t.id === state.selectedTrial)).join("");
  for (const row of document.querySelectorAll("#ev-trials .episode-row")) row.onclick = () => {
    state.selectedTrial = row.dataset.id;
    renderEval();
  };
  const trial = trials.find((t) => t.id === state.selectedTrial);
  $("#ev-transcript").innerHTML = trial ? transcriptHtml(trial, "") : `<div class="empty">pick a task or trial</div>`;
}

async function refreshEvals() {
  const sel = $("#ev-source"), chosen = sel.value;
  sel.innerHTML = evals().map((s) => `<option value="${s.id}" ${String(s.id) === chosen ? "selected" : ""}>${esc(s.name)}</option>`).join("");
  if (!sel.value) { $("#ev-table").innerHTML = `<tr><td class="empty">no tinkrl eval output directories</td></tr>`; return; }
  state.evalData = await api(`api/eval?source=${sel.value}`);
  renderEval();
}

// ---------- polling ----------
let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    state.sources = await api("api/sources");
    const page = (location.hash || "#curves").slice(1);
    if (page === "curves") await refreshCurves();
    else if (page === "episodes") await refreshEpisodes();
    else if (page === "evals") await refreshEvals();
    $("#live").classList.remove("stale");
    $("#live").textContent = `live · ${new Date().toLocaleTimeString()}`;
    document.body.dataset.ready = "1";
  } catch (e) {
    $("#live").classList.add("stale");
    $("#live").textContent = `not updating: ${e.message}`;
  } finally {
    busy = false;
  }
}

for (const id of ["#ep-env", "#ep-reward", "#ep-failed", "#ep-truncated"]) $(id).addEventListener("change", renderEpisodes);
$("#ep-search").addEventListener("input", renderEpisodes);
$("#ep-run").addEventListener("change", () => { state.episodes = null; refreshEpisodes(); });
$("#ep-step").addEventListener("change", () => { $("#ep-follow").checked = false; refreshEpisodes(); });
$("#ev-source").addEventListener("change", () => { state.selectedTrial = null; refreshEvals(); });
$("#metric-filter").addEventListener("input", () => renderMetricList(metricKeys()));
window.addEventListener("hashchange", showPage);
showPage();
setInterval(refresh, POLL_MS);
