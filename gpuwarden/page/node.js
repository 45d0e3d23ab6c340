// The gpuwarden node page: reads api/v1/gpus and api/v1/diagnosis (relative to the page) every few seconds and
// draws one card per GPU. Everything from the daemon goes into the page as text (textContent), never as markup.
"use strict";

const STATE_COLORS = {
  busy: "#2e7d32", starved: "#ef6c00", paused: "#90caf9", held_idle: "#ad1457", free: "#cfd8dc",
  unknown: "#9e9e9e", lost: "#212121",
};
const STATE_TEXT = {
  busy: "busy", starved: "starved (waiting on input)", paused: "paused by its job", held_idle: "held, idle",
  free: "free", unknown: "unknown", lost: "lost (could not be read)",
};

// Bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE and its kin) reorder what follows them on screen, so a name
// from the machine could read "exe.txt" for "txt\u202eexe.txt"; they, and the C0 and C1 controls, are shown as
// \uXXXX escapes wherever the page writes text or a title (as a terminal shows them: gpuwarden.terminal.visible).
const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
const shown = (s) => String(s).replace(HIDDEN, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") for (const [p, x] of Object.entries(v)) node.style.setProperty(p, x);
    else node.setAttribute(k, shown(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(typeof c === "string" ? document.createTextNode(shown(c)) : c);
  }
  return node;
}

const pct = (r) => `${Math.round(r * 100)}%`;
const gb = (b) => `${(b / 1e9).toFixed(1)} GB`;

// A row "label [bar] value": fraction = value / limit. With ``warn``, the bar turns "high" from 0.9 of the limit
// and "over" at or above it (a limit to stay under: memory, temperature, power; not activity or clocks).
function meter(label, value, limit, text, warn = true, key = label) {
  if (value === null || value === undefined) return null;
  const frac = limit ? value / limit : null;
  const level = !warn || frac === null ? "" : frac >= 1 ? " over" : frac >= 0.9 ? " high" : "";
  const bar = el("div", { class: "bar" + level },
    el("div", { style: { width: `${frac === null ? 0 : Math.min(100, Math.max(0, frac * 100)).toFixed(1)}%` } }));
  return el("div", { class: "meter", "data-meter": key }, el("span", {}, label), bar,
    el("span", { class: "value" }, text));
}

function strip(runs, windowSeconds, now) {
  const box = el("div", { class: "strip", title: `states over the last ${Math.round(windowSeconds)} s` });
  const from = now - windowSeconds;
  for (const r of runs || []) {
    const a = Math.max(r.start, from), b = Math.min(r.end, now);
    if (b <= a) continue;
    const seg = el("div", {
      "data-state": r.state, title: `${STATE_TEXT[r.state] || r.state}: ${Math.round(r.end - r.start)} s`,
      style: {
        left: `${((a - from) / windowSeconds * 100).toFixed(2)}%`,
        width: `${((b - a) / windowSeconds * 100).toFixed(2)}%`, background: STATE_COLORS[r.state] || "#000",
      },
    });
    box.append(seg);
  }
  const axis = el("div", { class: "strip-axis" }, el("span", {}, `${Math.round(windowSeconds)} s ago`),
    el("span", {}, "now"));
  return [box, axis];
}

function card(gpu, diag, windowSeconds, now) {
  const s = gpu.static, r = gpu.reading;
  const lost = !r || r.up === false;
  const d = diag && diag.diagnosis;
  const sev = lost ? "lost" : d ? d.severity : "none";
  const verdict = lost ? "lost" : d ? d.verdict.replaceAll("_", " ") : "no verdict yet";
  const node = el("article", { class: `gpu ${sev}`, "data-gpu": String(s.index), "data-verdict": lost ? "gpu_lost" :
    d ? d.verdict : "" },
    el("h3", {}, el("span", {}, `GPU ${s.index} · ${s.name}`), el("span", { class: "verdict" }, verdict)));
  if (d) {
    node.append(el("p", { class: "summary" }, d.summary));
    const code = diag.code_evidence;
    if (code && code.summary) node.append(el("p", { class: "code" }, el("b", {}, "Code: "), code.summary));
    if (d.remedies && d.remedies.length) node.append(el("p", { class: "remedy" }, el("b", {}, "What to do: "),
      d.remedies[0]));
    if (d.job) node.append(el("p", { class: "dim" }, `job ${d.job} (${d.job_kind})`));
  } else if (lost) {
    node.append(el("p", { class: "summary" }, `The GPU cannot be read: ${(r && r.error) || "no reading"}.`));
  }
  if (!lost) {
    // Activity and starved share over the verdict's own window (one figure per GPU, the one the verdict read),
    // else the last poll's utilization.
    const ev = (name) => { const e = d && d.evidence.find((x) => x.name === name); return e ? e.value : null; };
    const win = d ? ` · last ${Math.round(d.window_seconds)} s` : "";
    const sm = ev("sm_activity"), util = d ? ev("utilization_gpu") : r.utilization_gpu_ratio;
    const act = sm != null ? sm : util;
    const actLabel = sm != null ? "SM activity" : "utilization";
    const starved = ev("starved_share");
    node.append(...[
      meter(actLabel, act, 1, act == null ? "" : pct(act) + win, false, "activity"),
      starved != null ? meter("starved", starved, 1, pct(starved) + win, true, "starved") : null,
      meter("memory", r.memory_used_bytes, r.memory_total_bytes || s.memory_total_bytes,
        `${gb(r.memory_used_bytes || 0)} of ${gb(r.memory_total_bytes || s.memory_total_bytes || 0)}`),
      meter("temperature", r.temperature_gpu_celsius, s.temperature_thresholds_celsius.slowdown,
        `${r.temperature_gpu_celsius} °C` + (s.temperature_thresholds_celsius.slowdown ?
          ` (slowdown ${s.temperature_thresholds_celsius.slowdown})` : "")),
      meter("power", r.power_usage_watts, r.power_limit_watts,
        `${Math.round(r.power_usage_watts)} W` + (r.power_limit_watts ? ` of ${Math.round(r.power_limit_watts)}` : "")),
      meter("SM clock", r.clock_hertz.sm, s.clock_max_hertz.sm,
        `${Math.round((r.clock_hertz.sm || 0) / 1e6)} MHz` + (s.clock_max_hertz.sm ?
          ` of ${Math.round(s.clock_max_hertz.sm / 1e6)}` : ""), false),
    ].filter((x) => x !== null));
  }
  if (diag) node.append(...strip(diag.state_runs, windowSeconds, now));
  return node;
}

async function fetchJson(path) {
  const resp = await fetch(path, { cache: "no-store", headers: { accept: "application/json" } });
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

async function refresh() {
  const banner = document.getElementById("banner");
  let gpus, diagnosis = null;
  try {
    gpus = await fetchJson("api/v1/gpus");
  } catch (e) {
    banner.textContent = shown(`The daemon did not answer (${e.message}); showing the last data.`);
    banner.hidden = false;
    return;
  }
  try {
    diagnosis = await fetchJson("api/v1/diagnosis");
  } catch (e) {
    diagnosis = null; // the insight collector is off: readings only
  }
  const problems = [];
  if (!gpus.fresh) problems.push(gpus.down_reason ? `no readings: ${gpus.down_reason}` : "the readings are stale: the last poll is too old");
  if (diagnosis && !diagnosis.available) problems.push(`no diagnosis: ${diagnosis.reason}`);
  banner.textContent = shown(problems.join("; "));
  banner.hidden = problems.length === 0;

  document.getElementById("hostname").textContent = shown(gpus.hostname);
  document.title = shown(`gpuwarden · ${gpus.hostname}`);
  const age = gpus.last_poll_timestamp ? Math.max(0, Date.now() / 1000 - gpus.last_poll_timestamp) : null;
  const facts = [`${gpus.gpus.length} GPU${gpus.gpus.length === 1 ? "" : "s"}`, `source ${gpus.source}`];
  if (gpus.driver_version) facts.push(`driver ${gpus.driver_version}`);
  if (age !== null) facts.push(`last poll ${age.toFixed(0)} s ago`);
  if (diagnosis && diagnosis.node_imbalance_ratio != null)
    facts.push(`node imbalance ${diagnosis.node_imbalance_ratio.toFixed(2)} (0 balanced, 1 one GPU does all)`);
  document.getElementById("node").textContent = shown(facts.join(" · "));

  const byGpu = {};
  for (const g of (diagnosis && diagnosis.gpus) || []) byGpu[g.gpu] = g;
  const windowSeconds = (diagnosis && diagnosis.window_seconds) || 300;
  const now = (diagnosis && diagnosis.timestamp) || gpus.last_poll_timestamp || Date.now() / 1000;
  document.getElementById("gpus").replaceChildren(
    ...gpus.gpus.map((g) => card(g, byGpu[g.static.index], windowSeconds, now)));

  const jobs = (diagnosis && diagnosis.jobs) || [];
  document.getElementById("jobs-section").hidden = jobs.length === 0;
  document.querySelector("#jobs tbody").replaceChildren(...jobs.map((j) => el("tr", {},
    // a Slurm job keyed by its SLUID (Slurm 26.05+ cgroups) also shows the number users type (squeue, scancel)
    el("td", {}, j.job, j.slurm_job_id && j.slurm_job_id !== j.job ? ` (Slurm job ${j.slurm_job_id})` : ""),
    el("td", {}, j.job_kind), el("td", {}, j.gpus.join(", ")),
    el("td", {}, j.pids.join(", ")),
    el("td", {}, j.imbalance_ratio == null ? "- (one GPU)" : j.imbalance_ratio.toFixed(2)))));
}

document.getElementById("legend").replaceChildren(...Object.entries(STATE_TEXT).map(([k, v]) =>
  el("span", { style: { "--c": STATE_COLORS[k] } }, v)));
refresh();
setInterval(refresh, 1000 * Number(document.body.dataset.refreshSeconds || 5));
