// The lambdalake dashboard: every panel is a query through the serving API, redrawn every few
// seconds. The page holds no data. From `lambdalake serve`, the token comes from the URL fragment it
// prints; inside Airflow's UI there is none: Airflow's login cookie goes with every request.
"use strict";

const REFRESH_MS = 5000;
const TOKEN_KEY = "lambdalake-token";

const SQL = {
  revenue: `
    WITH series AS (
      SELECT 'speed' AS series, window_start, revenue FROM _lake.speed_revenue_by_category_5m
      UNION ALL SELECT 'batch', window_start, revenue FROM _lake.batch_revenue_by_category_5m
      UNION ALL SELECT 'merged', window_start, revenue FROM revenue_by_category_5m)
    SELECT series, date_trunc('hour', window_start) AS hour, sum(revenue) AS revenue
    FROM series
    WHERE window_start >= (SELECT max(window_start) FROM revenue_by_category_5m) - INTERVAL 48 HOUR
    GROUP BY ALL ORDER BY series, hour`,
  losses: `
    SELECT topic, 'late' AS kind, 'behind the watermark' AS reason, count(*) AS events FROM late_events GROUP BY topic
    UNION ALL
    SELECT topic, 'dlq', reason, count(*) FROM dlq GROUP BY topic, reason
    ORDER BY events DESC, topic, reason`,
  reconciliation: `
    SELECT view, date, metric, speed_value, batch_value, diff FROM reconciliation
    WHERE date IN (SELECT DISTINCT date FROM reconciliation ORDER BY date DESC LIMIT 3)
    ORDER BY date DESC, view, metric`,
  alerts: `SELECT "at", source, severity, message FROM ops_alerts ORDER BY "at" DESC LIMIT 12`,
};

function readToken() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname);  // keep the token out of the address bar
  }
  return sessionStorage.getItem(TOKEN_KEY);
}
const token = readToken();

// Paths relative to the page: the API is beside it, at / from `lambdalake serve`, at /lambdalake/ in Airflow.
async function api(path, sql) {
  const response = await fetch(path, {
    method: sql ? "POST" : "GET",
    headers: { ...(token && { Authorization: `Bearer ${token}` }), "Content-Type": "application/json" },
    body: sql ? JSON.stringify({ sql }) : undefined,
  });
  if (response.status === 401 || response.status === 403) {
    throw new Error(token ? "the token was refused: open the address `lambdalake serve` printed"
      : "not signed in: open the address `lambdalake serve` printed (it ends with #token=…), or sign in to Airflow");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

// ---- small helpers ----------------------------------------------------------------------------
const esc = (value) => String(value ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const num = (value, digits = 2) => value == null ? "" : Number(value).toLocaleString("en-US", { maximumFractionDigits: digits });
const compact = (value) => value >= 1e6 ? `${num(value / 1e6, 1)}M` : value >= 1e3 ? `${num(value / 1e3, 1)}k` : num(value, 0);
const utc = (iso) => iso ? iso.replace("T", " ").replace(/(\.\d+)?Z$/, "Z") : "";

function age(iso) {
  if (!iso) return "never";
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 120) return `${Math.round(seconds)} s ago`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} days ago`;
}

function table(columns, rows, rowClass = () => "") {
  const head = columns.map(([label, , cls]) => `<th class="${cls || ""}">${esc(label)}</th>`).join("");
  const body = rows.map((row) => `<tr class="${rowClass(row)}">` +
    columns.map(([, cell, cls]) => `<td class="${cls || ""}">${cell(row)}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

function show(id, state, html) {
  const panel = document.getElementById(id);
  panel.dataset.state = state;
  panel.querySelector(".body").innerHTML = html;
}

// ---- panels -----------------------------------------------------------------------------------
function revenueChart(rows) {
  const series = { speed: [], batch: [], merged: [] };
  for (const row of rows) series[row.series].push([Date.parse(row.hour), row.revenue]);
  const points = rows.map((row) => [Date.parse(row.hour), row.revenue]);
  const [x0, x1] = [Math.min(...points.map((p) => p[0])), Math.max(...points.map((p) => p[0]))];
  const yMax = Math.max(...points.map((p) => p[1])) * 1.1 || 1;
  const [width, height, left, right, bottom] = [1100, 240, 60, 40, 24];
  const x = (t) => left + (x1 > x0 ? (t - x0) / (x1 - x0) : 0.5) * (width - left - right);
  const y = (v) => (height - bottom) - (v / yMax) * (height - bottom - 10);
  let svg = "";
  for (const share of [0, 0.25, 0.5, 0.75, 1]) {
    svg += `<line class="grid" x1="${left}" x2="${width - right}" y1="${y(yMax * share)}" y2="${y(yMax * share)}"/>` +
      `<text x="${left - 6}" y="${y(yMax * share) + 4}" text-anchor="end">${compact(yMax * share)}</text>`;
  }
  const hours = [...new Set(points.map((p) => p[0]))].sort((a, b) => a - b);
  const every = Math.max(1, Math.ceil(hours.length / 12));
  hours.filter((_, i) => i % every === 0).forEach((t) => {
    const label = new Date(t).toISOString().slice(5, 13).replace("T", " ") + "h";
    svg += `<text x="${x(t)}" y="${height - 6}" text-anchor="middle">${label}</text>`;
  });
  for (const name of ["merged", "batch", "speed"]) {  // merged is a wide band under the other two
    if (series[name].length) {
      svg += `<polyline class="${name}" data-series="${name}" points="${series[name].map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ")}"/>`;
      // A dot per hour: a line needs two hours, and the first hour of data must show too.
      svg += series[name].map(([t, v]) =>
        `<circle class="${name}" data-series="${name}" cx="${x(t).toFixed(1)}" cy="${y(v).toFixed(1)}" r="3"/>`).join("");
    }
  }
  const legend = ["merged", "batch", "speed"].map((name) =>
    `<span><i class="${name}"></i>${name} (${series[name].length} h)</span>`).join("");
  return `<div class="legend">${legend}<span>UTC hours</span></div>` +
    `<svg viewBox="0 0 ${width} ${height}" width="100%" role="img" aria-label="revenue per hour">${svg}</svg>`;
}

async function revenue() {
  const rows = await api("api/query", SQL.revenue);
  if (!rows.length) return show("revenue", "empty", "no revenue windows yet: nothing has been streamed or batched");
  show("revenue", "data", revenueChart(rows));
}

// The stream's input backlog: landed files not read yet and how long the oldest has waited.
function waiting(row) {
  if (row.input_waiting_records != null) return `${num(row.input_waiting_records, 0)} records waiting`;
  if (row.input_waiting_files == null) return "input waiting: unknown";
  if (!row.input_waiting_files) return "no input waiting";
  const lag = row.input_lag_seconds;
  const oldest = lag < 120 ? `${Math.round(lag)} s` : lag < 7200 ? `${Math.round(lag / 60)} min` : `${Math.round(lag / 3600)} h`;
  return `${num(row.input_waiting_files, 0)} files waiting, oldest ${oldest}`;
}

async function freshness() {
  const rows = await api("api/status");
  const first = rows[0] || {};
  const stream = document.getElementById("stream");
  stream.textContent = `stream: ${first.stream_state || "unknown"}` + (first.heartbeat_at ? ` · heartbeat ${age(first.heartbeat_at)}` : "") +
    ` · ${waiting(first)}`;
  stream.className = `badge ${String(first.stream_state || "").replace(/\s+/g, "-")}`;
  if (!rows.length) return show("freshness", "empty", "no views");
  const covered = (row) => row.batch_covered_days ? row.batch_covered_days.split(", ") : [];
  show("freshness", "data", table([
    ["view", (r) => esc(r.view)],
    ["newest event counted", (r) => r.speed_max_event_time
      ? `${esc(utc(r.speed_max_event_time).slice(5, 16))} · ${esc(age(r.speed_max_event_time))}` : "none yet", "wrap"],
    ["updated", (r) => esc(age(r.speed_refreshed_at)), "wrap"],
    ["batch-covered days", (r) => covered(r).length ? `${covered(r).length}, last ${esc(covered(r).at(-1).slice(5))}` : "none", "wrap"],
    ["stale days", (r) => esc(r.stale_days || "none"), "wrap"],
  ], rows));
}

async function losses() {
  const rows = await api("api/query", SQL.losses);
  if (!rows.length) return show("losses", "empty", "no late events and no DLQ rows");
  const most = Math.max(...rows.map((r) => r.events));
  show("losses", "data", `<div class="scroll">${table([
    ["topic", (r) => esc(r.topic)],
    ["where", (r) => r.kind === "late" ? "late_events" : "dlq"],
    ["reason", (r) => esc(r.reason), "wrap"],
    ["events", (r) => num(r.events, 0), "num"],
    ["", (r) => `<span class="bar ${r.kind}" style="width:${Math.max(2, 120 * r.events / most)}px"></span>`],
  ], rows)}</div>`);
}

async function reconciliation() {
  const rows = await api("api/query", SQL.reconciliation);
  if (!rows.length) return show("reconciliation", "empty", "no nightly batch has run yet");
  const differs = (r) => Number(r.diff) !== 0;
  const days = new Set(rows.map((r) => r.date)).size;
  const summary = `<p>${days} day(s), ${rows.filter(differs).length} of ${rows.length} metrics differ (highlighted: the batch corrected the speed layer).</p>`;
  show("reconciliation", "data", summary + `<div class="scroll">${table([
    ["day", (r) => esc(r.date)],
    ["view", (r) => esc(r.view)],
    ["metric", (r) => esc(r.metric)],
    ["speed", (r) => num(r.speed_value), "num"],
    ["batch", (r) => num(r.batch_value), "num"],
    ["diff", (r) => num(r.diff), "num delta"],
  ], rows, (r) => differs(r) ? "diff" : "")}</div>`);
}

async function alerts() {
  const rows = await api("api/query", SQL.alerts);
  if (!rows.length) return show("alerts", "empty", "no alerts");
  show("alerts", "data", table([
    ["at (UTC)", (r) => esc(utc(r.at))],
    ["", (r) => esc(age(r.at))],
    ["source", (r) => esc(r.source)],
    ["severity", (r) => `<span class="severity-${esc(r.severity)}">${esc(r.severity)}</span>`],
    ["message", (r) => esc(r.message), "wrap"],
  ], rows));
}

// ---- refresh loop -----------------------------------------------------------------------------
const PANELS = { revenue, freshness, losses, reconciliation, alerts };
let refreshing = false;

async function refresh() {
  if (refreshing) return;  // a slow round is still running: skip this tick
  refreshing = true;
  const problems = [];
  await Promise.all(Object.entries(PANELS).map(async ([id, draw]) => {
    try {
      await draw();
    } catch (error) {
      problems.push(error.message);
      if (document.getElementById(id).dataset.state === "loading") show(id, "error", esc(error.message));
    }
  }));
  const problem = document.getElementById("problem");
  problem.hidden = problems.length === 0;
  problem.textContent = [...new Set(problems)].join("; ");
  document.getElementById("updated").textContent =
    `updated ${new Date().toISOString().slice(11, 19)} UTC · every ${REFRESH_MS / 1000} s`;
  refreshing = false;
}

refresh();
setInterval(refresh, REFRESH_MS);
